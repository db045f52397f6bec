"""Train the CPU-scale iso-depth sweep and fit the looped scaling law to it (issue #26, `make phi`).

    make phi                                                       # under 20 minutes on 2 cores
    .venv/bin/python launcher/phi.py --data data/python-stdlib --out runs/phi

27 RecurrentGPT runs, 1 + r x (4/r) + 1 for r in {1, 2, 4} at widths 32/48/64 and three training-FLOPs
budgets (rgpt_dist/studies/phi.py), one process each, two side by side; then `rgpt-eval phi` over them
into OUT/fit (phi.md, phi.json, phi.png). A pipeline check, not a measurement of phi: see
docs/evaluation.md. A finished run is kept, an interrupted one resumes; exit status 1 when a run fails.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


from rgpt_dist.studies.launch import train_runs
from rgpt_dist.studies.phi import overrides, plan


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="phi", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="rgpt-prep dataset (make phi prepares data/python-stdlib)")
    p.add_argument("--out", required=True, help="directory of the runs; the fit goes to OUT/fit")
    p.add_argument("--jobs", type=int, default=2, help="runs trained side by side, one process each (default 2)")
    p.add_argument("--restarts", type=int, default=500, help="L-BFGS-B starts per fit (default 500)")
    p.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples (default 200)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out).resolve()
    data = str(Path(args.data).resolve())
    if not (Path(data) / "manifest.json").is_file():
        print(f"phi: {data} is not an rgpt-prep dataset (no manifest.json)", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"phi: --jobs {args.jobs} must be >= 1", file=sys.stderr)
        return 2
    runs = plan()
    failed = train_runs(runs, lambda run: overrides(run, data, out), nproc=1, jobs=args.jobs)
    if failed:
        print(f"phi: {len(failed)} run(s) failed ({', '.join(failed)}); no fit", file=sys.stderr)
        return 1
    from launcher.eval import main as rgpt_eval

    return rgpt_eval(["phi", *(str(out / run.name) for run in runs), "--out", str(out / "fit"),
                      "--restarts", str(args.restarts), "--bootstrap", str(args.bootstrap)])


if __name__ == "__main__":
    sys.exit(main())
