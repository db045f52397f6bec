"""rgpt-algo from a checkout: `python launcher/algo.py train|eval|table ...` (rgpt_dist.algorithmic.cli)."""
from __future__ import annotations

import sys

from rgpt_dist.algorithmic.cli import main

if __name__ == "__main__":
    sys.exit(main())
