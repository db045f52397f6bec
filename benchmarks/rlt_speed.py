"""RLT training-step speed on CPU at the paper's width: RLT-1 against RLT-2 (B = 4), RLT-0 and the Transformer.

    .venv/bin/python benchmarks/rlt_speed.py                    # about 2 minutes (1 thread, micro-batch 32)
    .venv/bin/python benchmarks/rlt_speed.py --batch 8 --rounds 8   # a smaller batch: the loop weighs more
    .venv/bin/python benchmarks/rlt_speed.py --threads 4        # the paper's four threads (needs 4 free cores)
    .venv/bin/python benchmarks/rlt_speed.py --quick            # a smoke run (tests/benchmarks)

The bar (the RLT paper, section 2.7 and J.10: "chunk4 training steps are 2.27 times as fast
as RLT-1, and RLT-0 steps 4.17-4.30 times as fast", seed-42 CPU timing at 4 + 4, four threads):
the per-token loop must cost no more, relative to the parallel parts, than in the paper's
implementation, i.e. our step-time ratios RLT-1 / RLT-2 <= 2.27 and RLT-1 / RLT-0 <= 4.17.

What is timed: the flavours rlt1-4+4, rlt2-4+4, rlt0-4+4 and rlt-transformer-8 (width 512, 4 heads,
FFN 1,365, fp32), each on the same parity training batches (3-40 bits padded to 41 tokens, the
paper's training stream and its per-example loss normalisation left aside: the step's compute is
the same). One training step of a micro-batch = forward + backward (timed as "fwd+bwd"), then
gradient clipping at 1 and torch's AdamW (0.9, 0.95, weight decay 0.1) and zero_grad ("opt"). After
one warm-up round, `--rounds` rounds each run every model once, in an order rotated every round
(interleaved, so load from other jobs falls on all models alike); medians are reported. The paper's
optimizer step is a global batch of 512: 512 / B micro-batches of fwd+bwd and one AdamW update,
composed here from the two medians ("step@512"); its ratios are the ones held against the bar
(the single micro-batch step's ratios are printed too). FLOPs: the executed training FLOPs per token
from the family spec (3 x (executed forward incl. `executed_sequence_flops` + head)), so that the
time ratios can be read against the work ratios (close to 1: the gap is the sequential decoder).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rgpt_dist.algorithmic import get_task, make_batch  # noqa: E402
from rgpt_dist.sections import from_dict  # noqa: E402
from rgpt_dist.models.flavours import FLAVOURS  # noqa: E402
from rgpt_dist.flops import executed_forward_flops, head_flops  # noqa: E402
from rgpt_dist.models.spec import families  # noqa: E402
from rgpt_dist.registry import build_model  # noqa: E402

MODELS = {"RLT-1 4+4": "rlt1-4+4", "RLT-2 4+4 B=4": "rlt2-4+4", "RLT-0 4+4": "rlt0-4+4",
          "Transformer 8": "rlt-transformer-8"}
PAPER = {"rlt2": 2.27, "rlt0": 4.17}
"""The paper's speed-ups over RLT-1 (J.10: chunk4 2.27x; RLT-0 4.17-4.30x, the lower end is the bar)."""
SEQ_LEN, GLOBAL_BATCH = 41, 512   # parity: 40 bits + BOS; the paper's global batch


class Runner:
    """One model, its AdamW and its batch: `fwd_bwd()` and `opt()` return seconds."""

    def __init__(self, flavour: str, batch: int):
        data = FLAVOURS[flavour]
        self.cfg = from_dict(families()[data["family"]].config, data, "model")
        self.model = build_model(self.cfg, seed=0).train()
        self.opt_ = torch.optim.AdamW(self.model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
        b = make_batch(get_task("parity"), "train", range(batch), seq_len=SEQ_LEN)
        self.x = torch.from_numpy(b.tokens)                                   # (B, 41)
        self.y = torch.from_numpy(np.where(b.targets == -100, -1, b.targets))  # (B, 41), -1 unscored
        self.params = sum(p.numel() for p in self.model.parameters())

    def fwd_bwd(self) -> float:
        t = time.perf_counter()
        self.model(self.x, self.y).loss.backward()
        return time.perf_counter() - t

    def opt(self) -> float:
        t = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt_.step()
        self.opt_.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    def flops_per_token(self) -> float:
        """Executed training FLOPs per token: 3 x (forward as run + the head)."""
        return 3.0 * (executed_forward_flops(self.cfg, SEQ_LEN) + head_flops(self.cfg))


def measure(runners: dict[str, Runner], rounds: int) -> dict[str, dict[str, float]]:
    """Median fwd+bwd and opt seconds per model over `rounds` interleaved rounds (after one warm-up),
    and the fastest fwd+bwd ("fwd_bwd_min": the least disturbed round on a shared machine)."""
    names = list(runners)
    times = {n: {"fwd_bwd": [], "opt": []} for n in names}
    for i in range(rounds + 1):
        for n in names[i % len(names):] + names[:i % len(names)]:   # rotated: no model always first
            f, o = runners[n].fwd_bwd(), runners[n].opt()
            if i:                                                  # round 0 warms up
                times[n]["fwd_bwd"].append(f)
                times[n]["opt"].append(o)
    return {n: {**{k: statistics.median(v) for k, v in t.items()}, "fwd_bwd_min": min(t["fwd_bwd"])}
            for n, t in times.items()}


def report(runners: dict[str, Runner], med: dict[str, dict[str, float]], batch: int) -> bool:
    """Prints the table and the ratios; True when both ratios meet the paper's."""
    accum = GLOBAL_BATCH // batch
    step = {n: m["fwd_bwd"] + m["opt"] for n, m in med.items()}             # one micro-batch step
    full = {n: accum * m["fwd_bwd"] + m["opt"] for n, m in med.items()}     # the paper's 512-example step
    tokens = batch * SEQ_LEN
    print(f"| model | parameters | fwd+bwd ms (B={batch}) | opt ms | step ms | step@512 s | GFLOP/token (executed) "
          f"| GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for n, r in runners.items():
        fl = r.flops_per_token()
        print(f"| {n} | {r.params:,} | {1e3 * med[n]['fwd_bwd']:.0f} | {1e3 * med[n]['opt']:.0f} | "
              f"{1e3 * step[n]:.0f} | {full[n]:.2f} | {fl / 1e9:.4f} | {fl * tokens / med[n]['fwd_bwd'] / 1e9:.1f} |")
    one, two, zero, dense = (list(runners)[i] for i in range(4))
    ok = True
    print()
    for other, key, paper in ((two, "rlt2", PAPER["rlt2"]), (zero, "rlt0", PAPER["rlt0"])):
        ratio = full[one] / full[other]
        ok &= ratio <= paper
        print(f"{other} steps are {ratio:.2f}x as fast as RLT-1 at a 512-example step ({step[one] / step[other]:.2f}x "
              f"at one micro-batch + AdamW); paper {paper}x -> {'meets' if ratio <= paper else 'MISSES'} the bar "
              f"(<= {paper}); executed FLOPs RLT-1 / {other} = "
              f"{runners[one].flops_per_token() / runners[other].flops_per_token():.3f}")
    low = {n: accum * m["fwd_bwd_min"] + m["opt"] for n, m in med.items()}
    print(f"with the fastest fwd+bwd of each model instead of the median: RLT-1 / {two} {low[one] / low[two]:.2f}, "
          f"RLT-1 / {zero} {low[one] / low[zero]:.2f}, RLT-1 / {dense} {low[one] / low[dense]:.2f}")
    print(f"RLT-1 / {dense} step time: {full[one] / full[dense]:.2f} at a 512-example step "
          f"({step[one] / step[dense]:.2f} at one micro-batch + AdamW); executed FLOPs ratio "
          f"{runners[one].flops_per_token() / runners[dense].flops_per_token():.3f}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32, help="micro-batch (default 32, the paper's)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1; the paper ran 4: more threads "
                                                          "speed the parallel parts more than the per-token loop)")
    p.add_argument("--rounds", type=int, default=4, help="timed interleaved rounds after one warm-up (default 4)")
    p.add_argument("--quick", action="store_true", help="a smoke run: micro-batch 4, one round (its ratios are "
                                                        "not the bar's measurement)")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.rounds = 4, 1
    for name in ("batch", "threads", "rounds"):
        if getattr(args, name) < 1 or (name == "batch" and GLOBAL_BATCH % args.batch):
            p.exit(2, f"rlt_speed.py: --{name}={getattr(args, name)} must be a positive integer"
                      f"{' dividing 512' if name == 'batch' else ''}\n")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), fp32, parity batches B={args.batch} x "
          f"{SEQ_LEN} tokens, width 512, {args.rounds} interleaved rounds after one warm-up, medians")
    t0 = time.perf_counter()
    runners = {label: Runner(flavour, args.batch) for label, flavour in MODELS.items()}
    med = measure(runners, args.rounds)
    ok = report(runners, med, args.batch)
    print(f"\nwall {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
