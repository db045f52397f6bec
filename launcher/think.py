"""rgpt-think from a checkout: `python launcher/think.py train|frontier|table ...` (rgpt_dist.thinking.cli)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from a checkout

from rgpt_dist.thinking.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
