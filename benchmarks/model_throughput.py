"""Forward+backward throughput of a CPU-sized RecurrentGPT isoFLOPs layout against its dense
counterpart, interleaved A/B in one process, with MFU against a matmul peak measured in the same run.

    .venv/bin/python benchmarks/model_throughput.py            # full run (~3 minutes on 2 cores)
    .venv/bin/python benchmarks/model_throughput.py --quick    # smoke run (seconds)

Prints time(recurrent)/time(dense) per step, the Eq. 1 FLOPs ratio of the two layouts (the floor of
the raw time ratio: the recurrent layout executes the same blocks plus W_proj and the gate), and the
FLOP-normalised ratio = time ratio / FLOPs ratio (1.0 = the recurrent code is as efficient per FLOP
as the dense one). Target: FLOP-normalised ratio <= 1.03 in fp32.

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

from rgpt_dist.config import GPT2Config, RecurrentGPTConfig
from rgpt_dist.flops import executed_forward_flops, forward_flops, head_flops
from rgpt_dist.models.spec import spec_for
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
    model(idx, tgt, **kwargs).loss.backward()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, few steps (smoke test)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per model (default 12, quick 2)")
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
    steps = args.steps or steps
    common = dict(vocab_size=vocab, block_size=S, d_model=d, n_head=heads)
    dense_cfg = GPT2Config(n_layer=n_pre + n_rec * R + n_coda, **common)
    rec_cfg = RecurrentGPTConfig(n_pre=n_pre, n_rec=n_rec, n_loops=R, n_coda=n_coda, **common)
    models = {"dense": build_model(dense_cfg, seed=0).train(), "recurrent": build_model(rec_cfg, seed=0).train()}
    depth = {"dense": None, "recurrent": R}
    flops = {name: 3 * (forward_flops(cfg, S) + head_flops(cfg)) * B * S
             for name, cfg in (("dense", dense_cfg), ("recurrent", rec_cfg))}
    idx = torch.randint(0, vocab, (B, S))
    tgt = torch.roll(idx, -1, 1)
    for name, m in models.items():  # warm-up
        step_time(m, idx, tgt, depth[name], 0)
    times: dict[str, list[float]] = {"dense": [], "recurrent": []}
    for i in range(steps):  # interleaved A/B, alternating which goes first
        order = ("dense", "recurrent") if i % 2 == 0 else ("recurrent", "dense")
        for name in order:
            times[name].append(step_time(models[name], idx, tgt, depth[name], i + 1))
    peak = matmul_peak(256 if args.quick else 1024, 3 if args.quick else 10)

    malloc = "glibc defaults" if args.system_malloc else "malloc keeps freed memory"
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, fp32, B={B} S={S} d={d} vocab={vocab}, {malloc}")
    print(f"matmul peak: {peak / 1e9:.1f} GFLOP/s")
    for name, cfg in (("dense", dense_cfg), ("recurrent", rec_cfg)):
        t = statistics.median(times[name])
        layout = spec_for(cfg).layout(cfg)
        print(f"{name:>9} {layout:>8}: {t * 1e3:8.1f} ms/step  {B * S / t:8.0f} tok/s  "
              f"MFU {flops[name] / t / peak:6.1%}")
    time_ratio = statistics.median(times["recurrent"]) / statistics.median(times["dense"])
    flops_ratio = flops["recurrent"] / flops["dense"]
    print(f"time(recurrent)/time(dense) = {time_ratio:.3f}")
    executed_ratio = ((executed_forward_flops(rec_cfg, S) + head_flops(rec_cfg))
                      / (executed_forward_flops(dense_cfg, S) + head_flops(dense_cfg)))
    print(f"Eq.1 FLOPs ratio (incl. head) = {flops_ratio:.3f}  (matmul FLOPs executed: {executed_ratio:.3f})")
    print(f"FLOP-normalised ratio = {time_ratio / flops_ratio:.3f}  (target <= 1.03)")


if __name__ == "__main__":
    main()
