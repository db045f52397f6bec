"""Train the CPU-scale iso-depth sweep and fit the looped scaling law to it: `rgpt study phi run`
under its former name.

    make phi                                                       # under 20 minutes on 2 cores
    .venv/bin/python launcher/phi.py --data data/python-stdlib --out runs/phi

Every option is `rgpt study phi run`'s (rgpt study --help): --jobs, --restarts, --bootstrap.
"""
from __future__ import annotations

import sys

from launcher.study import main as study_main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    return study_main(["phi", "run", *argv])


if __name__ == "__main__":
    sys.exit(main())
