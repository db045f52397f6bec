"""Train the rows of the paper's sequential ablation (Fig. 5) on a scaled-down small cell and report:
`rgpt study ablation run` under its former name.

    make ablation                                                   # 10-13 minutes on 2 cores
    .venv/bin/python launcher/ablation.py --data data/python-stdlib --out runs/ablation
    .venv/bin/python launcher/ablation.py --data DATA --out OUT --preset quick       # smoke run

Every option is `rgpt study ablation run`'s (rgpt study --help).
"""
from __future__ import annotations

import sys

from launcher.study import main as study_main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    return study_main(["ablation", "run", *argv])


if __name__ == "__main__":
    sys.exit(main())
