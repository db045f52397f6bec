"""Training-step costs on CPU: activation checkpointing, memory against depth, ranks, MFU.

    .venv/bin/python benchmarks/train_throughput.py      # about 4 minutes on 2 cores (make bench sets
                                                         # the malloc variables; see docs/performance.md)

1. Step time (forward+backward, fp32, noise on) with per-recurrence checkpointing vs without,
   interleaved A/B in one process: ratio target <= 1.15.
2. Peak memory of one forward+backward for R in {1, 2, 4, 8, 16}, with and without checkpointing
   (torch's MemTracker), for every looped family: ratio R=16 / R=1 with checkpointing, target <= 1.25.
3. Throughput of 2 data-parallel ranks vs 1 (DeepSpeed ZeRO-2 under torchrun, the launcher's own
   tokens/s and MFU from metrics.jsonl).
4. Precision (parallel.dtype, issue #13): tokens/s of fp32, bf16 (DeepSpeed's bf16 mode) and
   bf16-autocast, 1 rank, ZeRO-2, the model of section 3 (each run twice, interleaved; the better
   one), and how far RecurrentGPT's h^(r) - h^(0) lands from fp32 under bf16 weights and under autocast.

    .venv/bin/python benchmarks/train_throughput.py --sections 4      # one section (about 4 minutes)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rgpt_dist.models.config import LoopedConfig  # noqa: E402
from rgpt_dist.models.spec import families, spec_for  # noqa: E402
from rgpt_dist.noise import NoiseKey  # noqa: E402
from rgpt_dist.parallel.checkpointing import apply_activation_checkpointing  # noqa: E402
from rgpt_dist.registry import build_model  # noqa: E402

SHAPE = dict(B=8, S=256)
MODEL = dict(vocab_size=4096, block_size=256, d_model=256, n_head=4, n_pre=1, n_rec=2, n_coda=1)


def make(r_max: int, mode: str, family: str = "recurrent_gpt"):
    model = build_model(spec_for(family).config(n_loops=r_max, **MODEL), seed=0).train()
    apply_activation_checkpointing(model, mode)
    idx = torch.randint(0, MODEL["vocab_size"], (SHAPE["B"], SHAPE["S"] + 1), generator=torch.Generator().manual_seed(0))
    return model, idx[:, :-1], idx[:, 1:]


def fwd_bwd(model, x, y, r, step=0):
    model.zero_grad(set_to_none=True)
    model(x, y, r=r, noise_key=NoiseKey(seed=0, step=step)).loss.backward()


def step_times(r: int, steps: int) -> dict[str, float]:
    """Median fwd+bwd seconds per checkpointing mode, the modes interleaved step by step."""
    modes = ("none", "recurrence", "selective")
    runs = {mode: make(r, mode) for mode in modes}
    for m, x, y in runs.values():
        fwd_bwd(m, x, y, r)
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for i in range(steps):
        for mode in modes[i % 3:] + modes[:i % 3]:
            m, x, y = runs[mode]
            t = time.perf_counter()
            fwd_bwd(m, x, y, r, i)
            times[mode].append(time.perf_counter() - t)
    return {mode: statistics.median(v) for mode, v in times.items()}


def peak_memory(r: int, mode: str, family: str = "recurrent_gpt") -> tuple[float, float]:
    """Peak bytes of one forward+backward, from torch's MemTracker, which follows every tensor's
    storage (CPU and GPU alike): (everything, everything but parameters and gradients). The second
    matters for RRT, whose LoRA parameters grow with R."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    m, x, y = make(r, mode, family)
    tracker = MemTracker()
    tracker.track_external(m)
    with tracker:
        fwd_bwd(m, x, y, r)
    peak = tracker.get_tracker_snapshot("peak").values()
    weights = sum(dev.get(_MemRefType.PARAM, 0) + dev.get(_MemRefType.GRAD, 0) for dev in peak)
    total = sum(dev["Total"] for dev in peak)
    return total, total - weights


def memory_table(family: str) -> None:
    """Peak memory for R in 1..16 per checkpointing mode, with the R=16 / R=1 ratios."""
    modes, depths = ("none", "recurrence", "selective"), (1, 2, 4, 8, 16)
    mem = {(r, mode): peak_memory(r, mode, family) for mode in modes for r in depths}
    print(f"2. {family}: peak memory of one step, MB (r = R; without parameters and gradients in brackets):")
    for mode in modes:
        row = "  ".join(f"R={r}: {mem[(r, mode)][0] / 2**20:6.1f} ({mem[(r, mode)][1] / 2**20:5.1f})" for r in depths)
        print(f"   {mode:>10}: {row}   R16/R1 = {mem[(16, mode)][0] / mem[(1, mode)][0]:.2f} "
              f"({mem[(16, mode)][1] / mem[(1, mode)][1]:.2f})")


def ranks_throughput(nproc: int, data: Path, run_dir: Path, *overrides: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(ROOT / "launcher" / "train.py"), str(ROOT / "configs" / "experiments" / "debug.yaml"),
           f"data.paths=[{data}]", f"log.run_dir={run_dir}", "train.seq_len=128", "train.micro_batch_size=8",
           "train.global_batch_size=16", "train.max_steps=30", "log.every_steps=10", "eval.every_steps=0",
           "checkpoint.every_steps=1000", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(2 // nproc), "WANDB_MODE": "disabled"}
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    return {"tokens_per_s": last["tokens_per_s"], "mfu": last["mfu"]}


PRECISIONS = ("fp32", "bf16", "bf16-autocast")


def recurrence_error(r: int, d_model: int) -> dict[str, float]:
    """Relative error of h^(r) - h^(0) against fp32 (RecurrentGPT debug model at init, eval, B=4,
    T=64, vocab 512): bf16 weights and activations (DeepSpeed's bf16 mode) vs autocast over fp32."""
    import copy

    from rgpt_dist.config import load_config

    cfg = load_config("recurrentgpt-debug", ["model.vocab_size=512", f"model.d_model={d_model}"]).model
    model = build_model(cfg, seed=0).eval()
    idx = torch.randint(0, cfg.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0))

    def delta(m, autocast):
        calls = []
        hook = m.recurrence.register_forward_hook(lambda mod, args, out: calls.append((args[0], out[0])))
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            m(idx, idx, r=r)
        hook.remove()
        return calls[-1][1].float() - calls[0][0].float()

    ref = delta(model, False)
    got = {"bf16": delta(copy.deepcopy(model).to(torch.bfloat16), False), "bf16-autocast": delta(model, True)}
    return {k: ((v - ref).norm() / ref.norm()).item() for k, v in got.items()}


def precision_section(data: Path, tmp: Path) -> None:
    runs: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    for i in range(2):
        for p in PRECISIONS:
            got = ranks_throughput(1, data, tmp / f"{p}-{i}", f"parallel.dtype={p}")
            runs[p].append(got["tokens_per_s"])
    best = {p: max(v) for p, v in runs.items()}
    print("4. precision, DeepSpeed ZeRO-2, 1 rank (2 threads), recurrentgpt-debug 1+1x4+1, seq 128: " + ", ".join(
        f"{p} {best[p]:,.0f} tok/s ({best[p] / best['fp32']:.2f}x fp32)" for p in PRECISIONS))
    for d in (64, 128):
        errs = {r: recurrence_error(r, d) for r in (1, 4)}
        print(f"   d={d}: |(h^(r) - h^(0)) - fp32| / |fp32|: " + "; ".join(
            f"r={r}: bf16 {e['bf16']:.3f}, bf16-autocast {e['bf16-autocast']:.3f}" for r, e in errs.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8, help="timed steps per variant (default 8)")
    p.add_argument("--families", default=",".join(n for n, s in families().items() if issubclass(s.config, LoopedConfig)),
                   help="comma-separated looped families for the memory table (default: all)")
    p.add_argument("--sections", default="1,2,3,4", help="comma-separated sections to run (default: all)")
    args = p.parse_args()
    sections = set(args.sections.split(","))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, B={SHAPE['B']} S={SHAPE['S']}, "
          f"RecurrentGPT 1+2xR+1 d=256 vocab 4096, noise on")
    if "1" in sections:
        times = step_times(r=4, steps=args.steps)
        print(f"1. step time R=4: " + ", ".join(f"{m} {t * 1e3:.0f} ms" for m, t in times.items()) +
              "; ratio to none: " + ", ".join(f"{m} {t / times['none']:.3f}" for m, t in times.items() if m != "none") +
              " (target <= 1.15)")
    if "2" in sections:
        for family in args.families.split(","):
            memory_table(family)
        print("   target with checkpointing: R16/R1 <= 1.25")
    if not sections & {"3", "4"}:
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "ds"
        subprocess.run([sys.executable, "-m", "data_prep.cli", str(ROOT / "rgpt_dist"), str(ROOT / "tests"), "--out",
                        str(data), "--seq-len", "128"], check=True, capture_output=True, cwd=ROOT)
        if "3" in sections:
            one = ranks_throughput(1, data, Path(tmp) / "r1")
            two = ranks_throughput(2, data, Path(tmp) / "r2")
            print(f"3. DeepSpeed ZeRO-2, recurrentgpt-debug 1+1x4+1, seq 128: 1 rank (2 threads) "
                  f"{one['tokens_per_s']:,.0f} tok/s MFU {one['mfu']:.1%}; 2 ranks (1 thread each) "
                  f"{two['tokens_per_s']:,.0f} tok/s MFU {two['mfu']:.1%}; 2 ranks / 1 rank = "
                  f"{two['tokens_per_s'] / one['tokens_per_s']:.2f}")
        if "4" in sections:
            precision_section(data, Path(tmp))


if __name__ == "__main__":
    main()
