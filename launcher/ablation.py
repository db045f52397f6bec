"""Train the rows of the paper's sequential ablation (Fig. 5) on a scaled-down small cell and report.

    make ablation                                                   # about 8 minutes on 2 cores
    .venv/bin/python launcher/ablation.py --data data/python-stdlib --out runs/ablation
    .venv/bin/python launcher/ablation.py --data DATA --out OUT --preset quick       # smoke run

One torchrun per run (2 processes, ZeRO-2, fp32; the presets of launcher/compare.py): the dense
baseline, recurrence alone, + prelude/coda, + state noise (and noise at initialisation only), +
prelude re-injection, + the gate (the full model), and the full model at a second seed
(the runs: rgpt_dist/studies/ablation.py; the report: rgpt_dist/eval/ablation_table.py). Writes OUT/ablations.md, OUT/ablation.png and OUT/grid.*; exit
status 1 when a run fails (the others still run and are reported).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


from rgpt_dist.studies.ablation import report
from rgpt_dist.studies.ablation import overrides, plan
from rgpt_dist.studies.launch import PRESETS, train_runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ablation", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="rgpt-prep dataset (make ablation prepares data/python-stdlib)")
    p.add_argument("--out", required=True, help="directory of the runs and the report")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="model width, batch and steps")
    p.add_argument("--nproc", type=int, default=2, help="processes per run (default 2)")
    args = p.parse_args(argv)
    out, data = Path(args.out).resolve(), str(Path(args.data).resolve())
    if not (Path(data) / "manifest.json").is_file():
        print(f"ablation: {data} is not an rgpt-prep dataset (no manifest.json)", file=sys.stderr)
        return 2
    failed = train_runs(plan(), lambda run: overrides(run, args.preset, data, out), args.nproc)
    paths = report(out)
    print(paths["md"].read_text())
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
