"""Train every model of a scaled-down small isoFLOPs cell on the embedded corpus and compare them.

    make compare                                                   # about 13 minutes on 2 cores
    make compare-long   # --preset long: 10x the tokens at d = 128, every model at two seeds (hours; resumable)
    .venv/bin/python launcher/compare.py --data data/python-stdlib --out runs/compare
    .venv/bin/python launcher/compare.py --data DATA --out OUT --preset quick       # smoke run
    make compare-rt   # --study rt: dense 4 x 64 against a layerwise Recurrent Transformer 2 x 90 (#27)

One torchrun per run (2 processes, ZeRO-2, fp32): the cell's dense baseline and every recurrent
family's 1+1x10+1 model at d=64, the same 100 steps of 16 x 128 tokens and seed for all, plus a
second seed of RecurrentGPT (the runs: rgpt_dist/studies/compare.py; the report:
rgpt_dist/eval/compare.py). `--study rt`: the dense model against an RT with half its layers at equal
non-embedding parameters, two seeds each (rgpt_dist/studies/rt_compare.py, rgpt_dist/eval/rt_compare.py;
OUT/rt_compare.{md,json,png}). A run already finished is kept, an interrupted one resumes from its
checkpoint. Writes OUT/compare.md (+ .json), OUT/grid.{md,csv,json}
and OUT/early_exit.png; exit status 1 when a run fails (the others still run and are reported).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable as a script from a checkout

from rgpt_dist.eval import compare as table1_report, rt_compare as rt_report  # noqa: E402
from rgpt_dist.studies import compare as table1, rt_compare as rt  # noqa: E402
from rgpt_dist.studies.launch import PRESETS, train_runs  # noqa: E402

STUDIES = {"table1": (table1, table1_report), "rt": (rt, rt_report)}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="rgpt-prep dataset (make compare prepares data/python-stdlib)")
    p.add_argument("--out", required=True, help="directory of the runs and the report")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="model width, batch and steps")
    p.add_argument("--nproc", type=int, default=2, help="processes per run (default 2)")
    p.add_argument("--study", choices=sorted(STUDIES), default="table1",
                   help="table1: every model of the small cell (default); rt: dense against the layerwise RT")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out).resolve()
    data = str(Path(args.data).resolve())
    if not (Path(data) / "manifest.json").is_file():
        print(f"compare: {data} is not an rgpt-prep dataset (no manifest.json)", file=sys.stderr)
        return 2
    study, reporter = STUDIES[args.study]
    every_seed = PRESETS[args.preset].get("every_seed") and args.study == "table1"  # rt: two seeds each already
    runs = study.plan(every_seed=True) if every_seed else study.plan()
    failed = train_runs(runs, lambda run: study.overrides(run, args.preset, data, out), args.nproc)
    paths = reporter.report(out, runs)
    print(paths["md"].read_text())
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
