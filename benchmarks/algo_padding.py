"""How much of an algorithmic training step is padding? `make rlt`'s models on one training batch,
padded to its longest example (what the trainer does) against the same examples sorted by length and
cut into 2, 4 and 8 micro-batches, each padded to its own longest (length buckets).

    .venv/bin/python benchmarks/algo_padding.py                          # parity at 3-16 bits, batch 256
    .venv/bin/python benchmarks/algo_padding.py --task s5_swaps --cap 32 # swaps-S5 at 1-32 operations
    .venv/bin/python benchmarks/algo_padding.py --quick                  # a smoke run (tests/benchmarks)

A measurement for a decision (docs/families.md, "Time"), with no bar. The models are the study's
(`rgpt_dist.studies.algorithmic.RLT_MODELS`: RLT-1 2 + 2, RLT-0 2 + 2, the Transformer 4, width 128,
muP m = 1), on the first `--batch` training examples of the task capped at `--cap` (the length
curriculum's stream). Timed: forward and backward of the whole batch (one thread; a warm-up round,
then the median of `--rounds`), ratios to the padded batch. The loss is the study's
(`train.loss_norm=example`: each example's mean over its scored positions, then the mean over
examples), and the buckets, of equal size, are averaged as the trainer averages micro-batches, so
together they give the padded batch's loss; the largest gradient difference, relative to the largest
gradient entry, is printed beside the time: rounding only, since causal models' scored positions
never see the padding after them.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rgpt_dist.algorithmic import get_task  # noqa: E402
from rgpt_dist.algorithmic.capped import capped  # noqa: E402
from rgpt_dist.algorithmic.loader import TaskLoader  # noqa: E402
from rgpt_dist.models.flavours import FLAVOURS  # noqa: E402
from rgpt_dist.models.layers import LayerFactory  # noqa: E402
from rgpt_dist.models.spec import families  # noqa: E402
from rgpt_dist.registry import build_model  # noqa: E402
from rgpt_dist.sections import apply_overrides, from_dict  # noqa: E402
from rgpt_dist.studies.algorithmic import RLT_MODELS  # noqa: E402

BUCKETS = (2, 4, 8)


def plans(task: str, cap: int, batch: int) -> tuple[dict[str, list], float]:
    """{"padded": [(x, y)], "K buckets": K (x, y)} of the stream's first step, the buckets as the
    trainer's loader cuts them (data.task_sort_by_length, micro-batches of batch / K), and the padded
    batch's padding share."""
    longest = get_task(task).max_tokens()  # train.seq_len: the loaders pad to the cap's longest
    out = {"padded": [next(iter(TaskLoader(task, longest, batch, batch, 1, 0, train_max=cap)))]}
    for k in BUCKETS:
        loader = TaskLoader(task, longest, batch // k, batch, 1, 0, train_max=cap, sort_by_length=True)
        out[f"{k} buckets"] = list(itertools.islice(iter(loader), k))
    t = capped(get_task(task), cap)
    lengths = [len(t.example("train", i, None).tokens) for i in range(batch)]
    return out, 1 - float(np.mean(lengths)) / out["padded"][0][0].shape[1]  # of the width the step pads to


def model_of(label: str) -> torch.nn.Module:
    flavour, overrides = RLT_MODELS[label]
    data = apply_overrides({"model": {**FLAVOURS[flavour], "mup_base_width": 128}}, list(overrides))["model"]
    factory = LayerFactory()
    factory.loss_norm = "example"  # the study's (configs/algorithmic/*.yaml), as rgpt_dist.train.run sets it
    return build_model(from_dict(families()[data["family"]].config, data, "model"), factory=factory, seed=0).train()


def step(model: torch.nn.Module, batches: list) -> list[torch.Tensor]:
    """Forward and backward of the batches (of equal size) as one optimizer step's micro-batches: their
    losses averaged, as the trainer does. Returns the gradients."""
    model.zero_grad(set_to_none=True)
    for x, y in batches:
        (model(x, y).loss / len(batches)).backward()
    return [p.grad.clone() for p in model.parameters()]


def measure(label: str, arms: dict[str, list], rounds: int) -> dict[str, tuple[float, float]]:
    """arm -> (median seconds of a step, largest gradient difference from the padded arm / largest entry)."""
    model = model_of(label)
    reference = step(model, arms["padded"])
    scale = max(float(g.abs().max()) for g in reference)
    times = {arm: [] for arm in arms}
    diffs = {arm: max(float((a - b).abs().max()) for a, b in zip(step(model, batches), reference)) / scale
             for arm, batches in arms.items()}  # also the warm-up round
    for r in range(rounds):
        for arm in list(arms)[r % len(arms):] + list(arms)[:r % len(arms)]:  # rotated: load falls alike
            start = time.perf_counter()
            step(model, arms[arm])
            times[arm].append(time.perf_counter() - start)
    return {arm: (statistics.median(times[arm]), diffs[arm]) for arm in arms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="parity", choices=("parity", "s5_swaps"))
    parser.add_argument("--cap", type=int, default=16, help="the longest training length (data.task_train_max)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="batch 16, cap 6, one round")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.cap, args.rounds = 16, 6, 1
    if args.batch < 1 or args.batch % max(BUCKETS) or args.rounds < 1:
        parser.error(f"--batch {args.batch} must be a positive multiple of {max(BUCKETS)} (equal buckets) and "
                     f"--rounds {args.rounds} at least 1")
    torch.set_num_threads(1)
    arms, share = plans(args.task, args.cap, args.batch)
    print(f"{args.task} at lengths up to {args.cap}, batch {args.batch}: {share:.1%} of the padded batch's "
          f"positions are padding; one thread, median of {args.rounds} rounds")
    for label in RLT_MODELS:
        result = measure(label, arms, args.rounds)
        base = result["padded"][0]
        cells = [f"{arm} {sec:.3f} s ({sec / base:.2f}x, grad diff {diff:.1e})" for arm, (sec, diff) in result.items()]
        print(f"{label:14s} " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
