"""Forward+backward throughput of a CPU-sized isoFLOPs layout of every looped family (RecurrentGPT and
its competitors) against its dense counterpart, interleaved round-robin in one process, with MFU
against a matmul peak measured in the same run.

    .venv/bin/python benchmarks/model_throughput.py            # full run (~3 minutes on 2 cores)
    .venv/bin/python benchmarks/model_throughput.py --quick    # smoke run (seconds)

Prints, per family at r = R, time(family)/time(dense) per step, the Eq. 1 training FLOPs ratio of the
two layouts (the looped layout executes the same blocks plus its per-step extras: W_proj and the
gate, an adapter, LoRA; the executed FLOPs can be fewer than Eq. 1 counts, so the raw time ratio can
dip under it), and the FLOP-normalised ratio = time ratio /
FLOPs ratio (1.0 = the family's code is as efficient per FLOP as the dense one). Target:
FLOP-normalised ratio <= 1.03 in fp32 (MoR, whose routed tokens are gathered and scattered: 1.05).

glibc's malloc returns large freed blocks to the OS and page-faults them back on the next step,
which on CPU costs more than the ops themselves and penalises whichever model allocates more
temporaries. The script re-executes itself with malloc tuned to keep freed memory (what PyTorch's
caching allocator does on GPUs); `--system-malloc` measures with the defaults instead.
"""
from __future__ import annotations

import argparse
import os
import sys
import statistics
import time

import torch

from rgpt_dist.models.config import LoopedConfig
from rgpt_dist.flops import executed_forward_flops, executed_overhead_flops, head_flops, train_flops
from rgpt_dist.models.spec import families, spec_for
from rgpt_dist.noise import NoiseKey
from rgpt_dist.registry import build_model


# Serve large tensors from the heap and never trim it (values are bytes).
_KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(2**35), "MALLOC_TRIM_THRESHOLD_": str(2**36),
                      "MALLOC_TOP_PAD_": str(2**30)}


def matmul_peak(n: int, reps: int) -> float:
    """FLOP/s of an n x n x n fp32 matmul (best of reps): the peak MFU is measured against."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def step_time(model, idx, tgt, r, step) -> float:
    model.zero_grad(set_to_none=True)
    t = time.perf_counter()
    kwargs = {} if r is None else {"r": r, "noise_key": NoiseKey(seed=0, step=step)}
    out = model(idx, tgt, **kwargs)
    (out.loss + out.aux.get("aux_loss", 0.0)).backward()  # what the trainer backpropagates (Ouro's J, MoR's BCE)
    return time.perf_counter() - t


TARGETS = {"mor": 1.05}
"""FLOP-normalised targets beyond the common 1.03: MoR gathers and scatters its routed tokens."""


def looped_families() -> list[str]:
    """Every registered family with the prelude/core/coda shape (RecurrentGPT and its competitors)."""
    return [name for name, spec in families().items() if issubclass(spec.config, LoopedConfig)]


def measure(models: dict, depth: dict, idx, tgt, steps: int) -> dict[str, list[float]]:
    """Step times, interleaved round-robin with a rotating start so no model always runs first."""
    for name, m in models.items():  # warm-up
        step_time(m, idx, tgt, depth[name], 0)
    names, times = list(models), {name: [] for name in models}
    for i in range(steps):
        for name in names[i % len(names):] + names[:i % len(names)]:
            times[name].append(step_time(models[name], idx, tgt, depth[name], i + 1))
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, few steps (smoke test)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per model (default 10, quick 2)")
    p.add_argument("--families", default=",".join(looped_families()),
                   help="comma-separated looped families to compare with dense (default: all)")
    p.add_argument("--system-malloc", action="store_true", help="keep glibc's default malloc trimming")
    args = p.parse_args()
    if not args.system_malloc and os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        env = {**os.environ, **_KEEP_FREED_MEMORY}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    torch.manual_seed(0)
    if args.quick:
        d, heads, S, B, vocab, (n_pre, n_rec, R, n_coda), steps = 64, 4, 64, 2, 512, (1, 1, 2, 1), 2
    else:  # the medium cell's 2+5x4+2 layout (24 block executions) at CPU width
        d, heads, S, B, vocab, (n_pre, n_rec, R, n_coda), steps = 256, 4, 256, 16, 4096, (2, 5, 4, 2), 10
    common = dict(vocab_size=vocab, block_size=S, d_model=d, n_head=heads)
    cfgs = {"dense": spec_for("gpt2").config(n_layer=n_pre + n_rec * R + n_coda, **common)}
    cfgs.update({name: spec_for(name).config(n_pre=n_pre, n_rec=n_rec, n_loops=R, n_coda=n_coda, **common)
                 for name in args.families.split(",")})
    models = {name: build_model(cfg, seed=0).train() for name, cfg in cfgs.items()}
    depth = {name: None if name == "dense" else R for name in cfgs}  # every family at r = R
    flops = {name: train_flops(cfg, S, depth[name]) * B * S for name, cfg in cfgs.items()}  # Eq. 1, head incl.
    idx = torch.randint(0, vocab, (B, S))
    times = measure(models, depth, idx, torch.roll(idx, -1, 1), args.steps or steps)
    peak = matmul_peak(256 if args.quick else 1024, 3 if args.quick else 10)
    report(args, cfgs, times, flops, peak, dict(B=B, S=S, d=d, vocab=vocab))


def report(args, cfgs: dict, times: dict, flops: dict, peak: float, shape: dict) -> None:
    malloc = "glibc defaults" if args.system_malloc else "malloc keeps freed memory"
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, fp32, "
          + " ".join(f"{k}={v}" for k, v in shape.items()) + f", {malloc}")
    print(f"matmul peak: {peak / 1e9:.1f} GFLOP/s")
    for name, cfg in cfgs.items():
        t = statistics.median(times[name])
        print(f"{name:>13} {spec_for(cfg).layout(cfg):>8}: {t * 1e3:8.1f} ms/step  "
              f"{shape['B'] * shape['S'] / t:8.0f} tok/s  MFU {flops[name] / t / peak:6.1%}")
    S, dense = shape["S"], cfgs["dense"]
    for name, cfg in cfgs.items():
        if name == "dense":
            continue
        time_ratio = statistics.median(times[name]) / statistics.median(times["dense"])
        flops_ratio = flops[name] / flops["dense"]
        tokens = shape["B"] * S
        readouts = spec_for(cfg).train_readout_flops(cfg, S, cfg.n_loops)  # Ouro reads out every iteration
        executed = ((executed_forward_flops(cfg, S) + head_flops(cfg) + readouts + executed_overhead_flops(cfg) / tokens)
                    / (executed_forward_flops(dense, S) + head_flops(dense)))
        print(f"{name}: time({name})/time(dense) = {time_ratio:.3f}, Eq.1 FLOPs ratio (incl. head) = "
              f"{flops_ratio:.3f} (forward matmul FLOPs executed: {executed:.3f}), "
              f"FLOP-normalised ratio = {time_ratio / flops_ratio:.3f}  (target <= {TARGETS.get(name, 1.03)}), "
              f"by executed FLOPs = {time_ratio / executed:.3f}")


if __name__ == "__main__":
    main()
