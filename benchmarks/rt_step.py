"""The layerwise Recurrent Transformer's training step against the dense model's, on CPU (issue #27).

    .venv/bin/python benchmarks/rt_step.py                  # about 3 minutes (1 thread)
    .venv/bin/python benchmarks/rt_step.py --quick          # smoke run (tests)

Two pairs at equal non-embedding parameters (d = 256 and its partner, vocabulary 512 so that the
layers, not the head, carry the step; ALiBi, QK-norm, RMSNorm, GELU 4d, no biases, fp32, tied heads
so that the totals are equal too):
- same shape: RT 4 x 256 against the dense 4 x 256 (exactly equal parameters);
- the authors' trade: RT 2 x 360 (6 heads of 60) against the dense 4 x 256 (2 x 12 x 360^2 = 3.11M
  against 4 x 12 x 256^2 = 3.15M matrix parameters), depth traded for width as in their 300M pair.
One training step of a micro-batch (forward + backward, the RT through its tiled scan, the training
path) at B = 8, N = 256; after a warm-up round, `--rounds` interleaved rounds in a rotated order
(load from other jobs falls on all models alike), medians. Work: the executed training FLOPs per
token from the family specs (3 x (executed forward + head)), torch's flop counter's count (the RT's
tiled scan visits each (query, key < query) pair once: fewer attention FLOPs than a Transformer's
full score matrix, plus the persistent pair's K and V, 4 d^2 per token and layer). The issue's bar:
time ratio / FLOP ratio <= 1.5; where it is not met the script says what bounds the RT.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rgpt_dist.sections import from_dict  # noqa: E402
from rgpt_dist.models.flavours import FLAVOURS  # noqa: E402
from rgpt_dist.flops import executed_forward_flops, head_flops, param_count  # noqa: E402
from rgpt_dist.models.spec import families  # noqa: E402
from rgpt_dist.registry import build_model  # noqa: E402

COMMON = {"vocab_size": 512, "pad_vocab_multiple": 1}
MODELS = {  # name -> (flavour it starts from, fields)
    "dense 4x256": ("rt-dense-debug", {"d_model": 256, "n_head": 4, "n_layer": 4}),
    "RT 4x256": ("rt-debug", {"d_model": 256, "n_head": 4, "n_layer": 4, "tie_embeddings": True}),
    "RT 2x360": ("rt-debug", {"d_model": 360, "n_head": 6, "n_layer": 2, "tie_embeddings": True}),
}
BAR = 1.5


class Runner:
    """One model and its batch: `step()` times forward + backward (seconds)."""

    def __init__(self, flavour: str, fields: dict, batch: int, seq: int):
        data = {**FLAVOURS[flavour], **COMMON, **fields, "block_size": seq}
        self.cfg = from_dict(families()[data["family"]].config, data, "model")
        self.model = build_model(self.cfg, seed=0).train()
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, COMMON["vocab_size"], (batch, seq), generator=g)   # (B, N)
        self.y = torch.randint(0, COMMON["vocab_size"], (batch, seq), generator=g)
        self.seq = seq

    def step(self) -> float:
        t = time.perf_counter()
        self.model(self.x, self.y).loss.backward()
        self.model.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    def flops(self) -> float:
        """Executed training FLOPs per token: 3 x (forward as run + the head)."""
        return 3.0 * (executed_forward_flops(self.cfg, self.seq) + head_flops(self.cfg))

    def counted(self) -> float:
        """torch's flop counter over one forward + backward, per token."""
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            self.model(self.x, self.y).loss.backward()
        self.model.zero_grad(set_to_none=True)
        return counter.get_total_flops() / self.x.numel()


def measure(runners: dict[str, Runner], rounds: int) -> dict[str, float]:
    names = list(runners)
    for n in names:
        runners[n].step()  # warm-up
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(rounds):
        for n in names[i % len(names):] + names[:i % len(names)]:  # rotated: no model always first
            times[n].append(runners[n].step())
    return {n: statistics.median(v) for n, v in times.items()}


def report(runners: dict[str, Runner], med: dict[str, float]) -> None:
    base = "dense 4x256"
    print(f"| model | params (non-emb.) | train FLOPs/token (spec / counter) | step | time ratio | FLOP ratio "
          f"| FLOP-normalised (bar {BAR}) |")
    print("|---|---|---|---|---|---|---|")
    for name, run in runners.items():
        flops, counted = run.flops(), run.counted()
        t_ratio, f_ratio = med[name] / med[base], flops / runners[base].flops()
        print(f"| {name} | {param_count(run.cfg, embeddings=False):,} | {flops / 1e6:.2f}M / {counted / 1e6:.2f}M | "
              f"{med[name] * 1e3:.0f} ms | {t_ratio:.2f} | {f_ratio:.3f} | {t_ratio / f_ratio:.2f} |")
    print("\nThe RT's forward runs N x n_layer sequential per-position steps (W_O, the MLP and the persistent "
          "pair's K and V on B rows each) and a fold matmul per position; the dense model runs each layer as "
          "a few (B N)-row matmuls. Where the FLOP-normalised ratio exceeds the bar, that sequential chain of "
          "small matmuls and its autograd graph (N x n_layer nodes per op) bounds the RT, not its FLOPs.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5, help="timed interleaved rounds after a warm-up (default 5)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="smoke run: B = 2, N = 16, one round")
    args = p.parse_args(argv)
    if min(args.batch, args.seq, args.rounds, args.threads) < 1:
        print("rt_step: --batch, --seq, --rounds and --threads must be >= 1", file=sys.stderr)
        return 2
    if args.quick:
        args.batch, args.seq, args.rounds = 2, 16, 1
    torch.set_num_threads(args.threads)
    runners = {name: Runner(flavour, fields, args.batch, args.seq) for name, (flavour, fields) in MODELS.items()}
    print(f"B = {args.batch}, N = {args.seq}, {args.threads} thread(s), fp32, {args.rounds} rounds (medians)\n")
    report(runners, measure(runners, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
