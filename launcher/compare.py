"""Train every model of a scaled-down small isoFLOPs cell and compare them: `rgpt study compare`
(and `rgpt study compare-long`, `rgpt study rt-compare`) under its former name.

    make compare                                                   # about 13 minutes on 2 cores
    .venv/bin/python launcher/compare.py --data data/python-stdlib --out runs/compare
    .venv/bin/python launcher/compare.py --data DATA --out OUT --preset quick       # smoke run
    .venv/bin/python launcher/compare.py --study rt --data DATA --out OUT           # = rgpt study rt-compare run

Every option is `rgpt study compare run`'s (rgpt study --help); --study table1|rt picks the study.
"""
from __future__ import annotations

import sys

from launcher.study import main as study_main

STUDIES = {"table1": "compare", "rt": "rt-compare"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = "compare"
    if "--study" in argv:
        i = argv.index("--study")
        name = STUDIES.get(argv[i + 1] if i + 1 < len(argv) else "", "")
        if not name:
            print(f"compare: --study must be one of {', '.join(STUDIES)}", file=sys.stderr)
            return 2
        del argv[i:i + 2]
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    return study_main([name, "run", *argv])


if __name__ == "__main__":
    sys.exit(main())
