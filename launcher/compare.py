"""Train every model of a scaled-down small isoFLOPs cell on the embedded corpus and compare them.

    make compare                                                   # about 13 minutes on 2 cores
    make compare-long   # --preset long: 10x the tokens at d = 128, every model at two seeds (hours; resumable,
                        # --record results/compare-long keeps finished runs in the checkout across machines)
    .venv/bin/python launcher/compare.py --data data/python-stdlib --out runs/compare
    .venv/bin/python launcher/compare.py --data DATA --out OUT --preset quick       # smoke run
    ... --nproc 1 --jobs 2     # two one-process runs at a time instead of one two-process run
    ... --only 'ouro-*'        # train only these runs now (fnmatch, comma-separated); the report covers all
    make compare-rt   # --study rt: dense 4 x 64 against a layerwise Recurrent Transformer 2 x 90 (#27)

One torchrun per run (2 processes, ZeRO-2, fp32): the cell's dense baseline and every recurrent
family's 1+1x10+1 model at d=64, the same 100 steps of 16 x 128 tokens and seed for all, plus a
second seed of RecurrentGPT (the runs: rgpt_dist/studies/compare/__init__.py; the report:
rgpt_dist/studies/compare/report.py). `--study rt`: the dense model against an RT with half its layers at equal
non-embedding parameters, two seeds each (rgpt_dist/studies/rt_compare/__init__.py, rgpt_dist/studies/rt_compare/report.py;
OUT/rt_compare.{md,json,png}). A run already finished is kept, an interrupted one resumes from its
checkpoint; with --record DIR a run recorded in DIR is not trained again (rgpt_dist.studies.records),
each run that finishes is recorded there, and the runs are trained cheapest first (training FLOPs per
token), so a machine's time runs out on as few unfinished runs as possible. Writes OUT/compare.md (+ .json), OUT/grid.{md,csv,json}
and OUT/early_exit.png; exit status 1 when a run fails (the others still run and are reported).
"""
from __future__ import annotations

import argparse
import fnmatch
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from rgpt_dist.studies.compare import report as table1_report
from rgpt_dist.studies.rt_compare import report as rt_report
from rgpt_dist.studies import compare as table1, records, rt_compare as rt
from rgpt_dist.studies.launch import PRESETS, train_runs

STUDIES = {"table1": (table1, table1_report), "rt": (rt, rt_report)}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="rgpt-prep dataset (make compare prepares data/python-stdlib)")
    p.add_argument("--out", required=True, help="directory of the runs and the report")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="model width, batch and steps")
    p.add_argument("--nproc", type=int, default=2, help="processes per run (default 2)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at a time (default 1; e.g. 2 with --nproc 1 "
                   "on 2 cores)")
    p.add_argument("--study", choices=sorted(STUDIES), default="table1",
                   help="table1: every model of the small cell (default); rt: dense against the layerwise RT")
    p.add_argument("--record", help="keep each finished run's config.yaml, metrics.jsonl and record.json here "
                   "(commit them): a run recorded here is not trained again, so a long study goes on across machines")
    p.add_argument("--only", help="train only the runs whose names match these comma-separated fnmatch patterns "
                   "(e.g. 'ouro-*' to start a long run first on a fresh machine); the report still covers every run")
    return p


def _chosen(runs: list, only: str | None) -> list:
    """The runs matching any of `only`'s patterns (all when None); ValueError names a pattern that
    matches no run."""
    if only is None:
        return runs
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(r.name, p) for r in runs)]
    if unmatched or not patterns:
        raise ValueError(f"--only {only!r}: {unmatched or 'no pattern'} matches none of {[r.name for r in runs]}")
    return [r for r in runs if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def _pending(runs, args_of, record: Path, out: Path, data: str) -> list:
    """The runs not yet recorded, cheapest first by their configs' training FLOPs per token."""
    from rgpt_dist.config.experiment import load_config
    from rgpt_dist.flops import train_flops

    configs = {run.name: load_config(ROOT / run.config, args_of(run)) for run in runs}
    todo = records.pending(runs, configs, record, out, data)
    cost = {name: train_flops(cfg.model, cfg.train.seq_len) for name, cfg in configs.items()}
    return sorted(todo, key=lambda run: cost[run.name])


def _recorder(out: Path, record: Path, data: str):
    """on_end of train_runs: tally every launch of a run; record the run once it has succeeded."""
    def on_end(run, wall_s: float, returncode: int) -> None:
        records.launch_ended(out / run.name, wall_s, returncode)
        if returncode == 0:
            records.save(out / run.name, record / run.name, data_dir=data)
    return on_end


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out).resolve()
    data = str(Path(args.data).resolve())
    if args.nproc < 1 or args.jobs < 1:
        print(f"compare: --nproc {args.nproc} and --jobs {args.jobs} must be >= 1", file=sys.stderr)
        return 2
    if not (Path(data) / "manifest.json").is_file():
        print(f"compare: {data} is not an rgpt-prep dataset (no manifest.json)", file=sys.stderr)
        return 2
    study, reporter = STUDIES[args.study]
    every_seed = PRESETS[args.preset].get("every_seed") and args.study == "table1"  # rt: two seeds each already
    runs = study.plan(every_seed=True) if every_seed else study.plan()
    try:
        chosen = _chosen(runs, args.only)
    except ValueError as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)  # the report is written even when every run failed
    args_of = lambda run: study.overrides(run, args.preset, data, out)  # noqa: E731
    record = Path(args.record).resolve() if args.record else None
    # every recorded run is restored into `out` (the report covers them all), only chosen ones trained
    todo = [run for run in (_pending(runs, args_of, record, out, data) if record else runs) if run in chosen]
    failed = train_runs(todo, args_of, args.nproc, args.jobs, on_end=_recorder(out, record, data) if record else None)
    paths = reporter.report(out, runs)
    print(paths["md"].read_text())
    if record:
        kept = [record / run.name for run in runs]
        print(f"the runs' wall time, summed over the machines that trained them: "
              f"{records.wall_seconds(kept) / 3600:.2f} h ({records.wall_seconds(kept, 'train_s') / 3600:.2f} h "
              "in training steps)")
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
