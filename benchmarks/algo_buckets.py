"""Length buckets through the trainer: `make rlt`'s three models trained for a few steps on parity at
the paper's 3-40 bits (the study's longest phase), the trainer's padded step against the same step
with data.task_sort_by_length=true in `--buckets` micro-batches, the two arms side by side (one thread
each, as the study's two lanes run), each through `rgpt algo train` (launcher.algo, one process).

    .venv/bin/python benchmarks/algo_buckets.py                 # 20 steps of 256 in 4 micro-batches each arm
    .venv/bin/python benchmarks/algo_buckets.py --padded-micro-batch 256   # against make rlt's own step
    .venv/bin/python benchmarks/algo_buckets.py --slowed        # the bar failing: the buckets arm unsorted
    .venv/bin/python benchmarks/algo_buckets.py --quick         # a smoke run (tests/benchmarks)

The padded arm runs the buckets arm's micro-batches unsorted, each padded to the step's longest, so
the ratio is what sorting saves; `--padded-micro-batch 256` runs it as `make rlt` does (one
micro-batch), which adds what the smaller micro-batches alone change (RLT-1's loop over positions
costs more per example in smaller ones, the parallel models less). A step's time comes from the
run's own log (metrics.jsonl: each window's tokens over its tokens/s), the first window (start-up,
first allocations) left out. Bar: every model's bucketed step takes at most `--bar` (0.9) of its
padded step. `--slowed` runs the buckets arm unsorted too, which must fail the bar. The final
training losses are printed beside the times: the same examples per step, the gradients equal up
to rounding (tests/algorithmic/test_length_buckets.py), so the trajectories agree early and part
with rounding.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rgpt_dist.studies.algorithmic import RLT_MODELS, RLT_RECIPE  # noqa: E402
from rgpt_dist.train.metrics import read_metrics  # noqa: E402

BATCH = 256  # the study's global batch (RLT_RECIPE)


def recipe(steps: int, cap: int) -> list[str]:
    """The study's parity recipe, fixed at lengths up to `cap` (0: the paper's 3-40) for `steps` steps,
    logged every 5 steps, no evaluation (the warm-up at most half the steps: times do not depend on it)."""
    keep = [o for o in RLT_RECIPE if not o.startswith(("data.task_", "train.max_steps", "eval.", "checkpoint.",
                                                       "train.micro_batch_size", "train.warmup_steps"))]
    return [*keep, f"data.task_train_max={cap}", "data.task_grow_by=0", f"train.max_steps={steps}",
            f"train.warmup_steps={min(40, steps // 2)}",
            "eval.every_steps=0", f"checkpoint.every_steps={steps}", "checkpoint.keep_best=false",
            "log.every_steps=5"]


def arm(out: Path, flavour: str, extra: tuple[str, ...], overrides: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "launcher.algo", "train", "parity", "--model", flavour, "--seed", "42",
           "--out", str(out), "--nproc", "1", *extra, *overrides]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def step_time(run: Path) -> tuple[float, float]:
    """(seconds per step after the first logged window, the last logged training loss)."""
    train = [r for _, r in read_metrics(run / "metrics.jsonl") if "tokens_per_s" in r]
    if len(train) < 2:
        raise SystemExit(f"{run}: fewer than two logged windows")
    seconds = sum((b["tokens"] - a["tokens"]) / b["tokens_per_s"] for a, b in zip(train, train[1:]))
    return seconds / (train[-1]["step"] - train[0]["step"]), train[-1]["loss"]


def measure(label: str, args: argparse.Namespace, root: Path) -> tuple[float, float, float, float]:
    flavour, extra = RLT_MODELS[label]
    base = recipe(args.steps, args.cap)
    buckets = [f"train.micro_batch_size={BATCH // args.buckets}"]
    if not args.slowed:
        buckets.append("data.task_sort_by_length=true")
    padded = f"train.micro_batch_size={args.padded_micro_batch or BATCH // args.buckets}"
    runs = {"padded": (root / f"{label}-padded", [*base, padded]),
            "buckets": (root / f"{label}-buckets", [*base, *buckets])}
    procs = {name: arm(out, flavour, extra, overrides) for name, (out, overrides) in runs.items()}
    for name, proc in procs.items():
        _, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"{label} {name} failed ({proc.returncode}):\n{err[-3000:]}")
    (pad_s, pad_loss), (buck_s, buck_loss) = (step_time(runs[name][0]) for name in ("padded", "buckets"))
    return pad_s, buck_s, pad_loss, buck_loss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cap", type=int, default=0, help="the longest training length (0: the paper's 3-40)")
    parser.add_argument("--buckets", type=int, default=4, choices=(2, 4, 8))
    parser.add_argument("--padded-micro-batch", type=int, default=0, choices=(0, 32, 64, 128, 256),
                        help="the padded arm's micro-batch (0: the buckets arm's)")
    parser.add_argument("--bar", type=float, default=0.9)
    parser.add_argument("--slowed", action="store_true", help="the buckets arm without sorting (must FAIL)")
    parser.add_argument("--models", default=",".join(RLT_MODELS), help="comma-separated, of " + ", ".join(RLT_MODELS))
    parser.add_argument("--quick", action="store_true",
                        help="the Transformer only, 10 steps at 3-8 bits (a smoke run; no verdict)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.cap, args.models = 10, 8, "transformer-4"
    models = args.models.split(",")
    if any(m not in RLT_MODELS for m in models):
        parser.error(f"--models {args.models!r}: each one of {', '.join(RLT_MODELS)}")
    if args.steps < 10:
        parser.error(f"--steps {args.steps}: at least 10 (two logged windows of 5 after the first)")
    padded = args.padded_micro_batch or BATCH // args.buckets
    print(f"parity at {'3-40' if not args.cap else f'3-{args.cap}'} bits, batch {BATCH}, {args.steps} steps: "
          f"{args.buckets} buckets{' (slowed: unsorted)' if args.slowed else ''} against micro-batches of "
          f"{padded} padded; two arms side by side, one thread each")
    ok = True
    with tempfile.TemporaryDirectory(prefix="algo-buckets-") as tmp:
        for label in models:
            pad_s, buck_s, pad_loss, buck_loss = measure(label, args, Path(tmp))
            ratio = buck_s / pad_s
            ok &= ratio <= args.bar
            print(f"{label:14s} padded {pad_s:.3f} s/step | buckets {buck_s:.3f} s/step ({ratio:.2f}x) | "
                  f"final loss {pad_loss:.4g} / {buck_loss:.4g}", flush=True)
    if args.quick:
        return 0
    print(f"{'PASS' if ok else 'FAIL'}: every bucketed step at most {args.bar}x its padded step")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
