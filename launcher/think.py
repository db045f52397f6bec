"""rgpt-think from a checkout: `python launcher/think.py train|frontier|table ...` (rgpt_dist.thinking.cli)."""
from __future__ import annotations

import sys

from rgpt_dist.thinking.cli import main

if __name__ == "__main__":
    sys.exit(main())
