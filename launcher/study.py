"""rgpt study: the studies, each one command to train, report and write its cluster grid.

    rgpt study compare run --data data/python-stdlib --out runs/compare          # about 13 min on 2 cores
    rgpt study compare run --data DATA --out OUT --preset quick --nproc 1 --jobs 2   # a smoke run
    rgpt study compare-long run --data data/python-stdlib --out runs/compare-long    # hours; resumes
    rgpt study rlt run --out runs/rlt                                            # about 60 min
    rgpt study thinking report --out runs/thinking                               # the report alone
    rgpt study phi grid                                                          # configs + slurm/phi_grid.sh
    rgpt study list                                                              # every study, one line each

run: trains the runs not finished (an interrupted one resumes from its checkpoint), each run's
output in OUT/<run>.log, then writes the report into OUT; exit status 1 when a run fails (the others
still run and are reported). With --record DIR each finished run's config, metrics and evaluation are
kept in DIR (commit them; compare-long, rlt and thinking keep theirs in results/ by default); a
language-model run recorded there on the same data and config is not trained again. report: the
report from what OUT holds. grid: the study's cluster grid (configs/experiments/*, slurm/*.sh) into
the checkout.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from launcher.arg_types import BOOTSTRAP_ARG, RESTARTS_ARG
from rgpt_dist import progress
from rgpt_dist.studies import NAMES, runner, study
from rgpt_dist.studies.base import ROOT, Context, chosen
from rgpt_dist.studies.launch import PRESETS

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rgpt study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=(*NAMES, "list"), metavar="NAME", help="one of: " + ", ".join(NAMES) + "; or list")
    p.add_argument("action", nargs="?", choices=("run", "report", "grid"), help="run, report or grid")
    p.add_argument("--data", help="rgpt-prep dataset of the language-model studies (data/python-stdlib: "
                   "rgpt prep python-stdlib --out data/python-stdlib --seq-len 128)")
    p.add_argument("--out", help="the study's directory: its runs and its report (default runs/<name>)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="model width, batch and steps (the study's default)")
    p.add_argument("--nproc", type=int, help="processes per run (the study's default)")
    p.add_argument("--jobs", type=int, help="runs trained side by side (the study's default)")
    p.add_argument("--only", help="train only the runs matching these comma-separated fnmatch patterns; the report "
                   "still covers every run")
    p.add_argument("--record", help="keep finished runs here (default: the study's results/ directory, if any)")
    p.add_argument("--no-record", action="store_true", help="keep no records")
    p.add_argument("--restarts", type=RESTARTS_ARG, default=500, help="phi: L-BFGS-B starts per fit")
    p.add_argument("--bootstrap", type=BOOTSTRAP_ARG, default=200, help="phi: bootstrap resamples")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    # SIGTERM ends the study's runs too (rgpt_dist.studies.launch stops them on the way out)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.quiet:
        progress.quiet()
    if args.name == "list":
        for name in NAMES:
            print(f"  {name:13s} {study(name).summary}\n  {'':13s} reproduces: {study(name).reproduces}")
        return 0
    if args.action is None:
        return _refuse(f"{args.name}: give an action: run, report or grid")
    s = study(args.name)
    if args.action == "grid":
        written = s.grid(ROOT)
        print(f"{args.name}: wrote {len(written)} file{'s' * (len(written) != 1)}"
              + (f" ({written[0]}{' ...' * (len(written) > 1)})" if written else ""))
        return 0
    ctx, problem = _context(s, args)
    if problem:
        return _refuse(problem)
    if args.action == "report":
        paths = s.report(ctx, s.plan(ctx.preset))
        if s.needs_data:  # the task suites' table commands print what they wrote themselves
            print(f"wrote {', '.join(str(p) for p in paths.values())}")
        return 0
    try:
        chosen(s.plan(ctx.preset), args.only)  # a typo trains nothing
    except ValueError as e:
        return _refuse(f"{s.name}: {e}")
    record = None if args.no_record else args.record or s.record
    return runner.run(s, ctx, only=args.only, record=Path(record).resolve() if record else None)


def _context(s, args) -> tuple[Context | None, str | None]:
    """The run's context from the arguments and the study's defaults, or the reason it is refused."""
    preset = args.preset or s.presets[0]
    nproc = s.default_nproc if args.nproc is None else args.nproc
    jobs = s.default_jobs if args.jobs is None else args.jobs
    if preset not in s.presets:
        return None, f"{s.name}: --preset {preset} is not one of its presets ({', '.join(s.presets)})"
    if nproc < 1 or jobs < 1:
        return None, f"{s.name}: --nproc {nproc} and --jobs {jobs} must be >= 1"
    data = None
    if s.needs_data:
        if args.data is None or not (Path(args.data) / "manifest.json").is_file():
            return None, f"{s.name}: --data {args.data} is not an rgpt-prep dataset (no manifest.json)"
        data = str(Path(args.data).resolve())
    out = Path(args.out or f"runs/{s.name}").resolve()
    return Context(out=out, data=data, preset=preset, nproc=nproc, jobs=jobs,
                   options={"restarts": args.restarts, "bootstrap": args.bootstrap}), None


def _refuse(message: str) -> int:
    print(f"rgpt study {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
