"""The layerwise Recurrent Transformer's exact tiled prefill (rgpt_dist/models/rt/tiled.py `scan`) against
the naive per-position loop (`naive_scan`) on CPU: one layer at a width where it matters, N = 256, 512,
1024 (issue 27, SPEC section 9).

    .venv/bin/python benchmarks/rt_prefill.py               # 4-6 minutes (1 thread, fwd and fwd+bwd)
    .venv/bin/python benchmarks/rt_prefill.py --no-backward # forward (prefill) only, about 1.5-2 minutes
    .venv/bin/python benchmarks/rt_prefill.py --quick       # smoke run (seconds)

What is timed: one layer's attention scan over N positions, B = 1, H = 8 heads of hd = 64 (d = 512),
fp32, with two steps (the per-position work between a_t and position t's persistent pair):
- "RT layer": what the family runs per position (SPEC section 9): the output map W_O, z_t = x_t + (a_t
  + MLP(RMS(x_t + a_t / sqrt L))) / sqrt L with a GELU MLP of width 4d, then the persistent pair
  k_t = RMS_head(K RMS z_t), v_t = V RMS z_t (L = 12 layers' residual scaling; 22 d^2 FLOPs per
  position, the weights read once per position at B = 1);
- "attention only": k_t = v_t = a_t, so that the scan's own cost shows.
Forward is timed under no_grad (prefill); forward+backward ("fwd+bwd", training) backpropagates the sum
of the pairs and the outputs z_t into q, the temporary pairs and the step's weights. Each round runs
every (step, N, scan) cell once in a rotated order (load from other jobs falls on all alike) after one
warm-up round; medians are printed with the naive / tiled time ratio. Key reads come from the scans'
counters (a run at B = H = hd = 1: they do not depend on the width), with the bytes they mean at this
width (k and v, fp32, per sequence); the tiled scan's are (N/2) log2 N, the naive loop's N (N - 1) / 2.

glibc's malloc returns large freed blocks to the OS and faults them back, which would penalise the
naive loop's growing stacks; the script re-executes itself with malloc keeping freed memory (as
benchmarks/model_throughput.py does); `--system-malloc` measures with the defaults.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rgpt_dist.models.rt.tiled import naive_scan, scan  # noqa: E402

_KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(2**35), "MALLOC_TRIM_THRESHOLD_": str(2**36),
                      "MALLOC_TOP_PAD_": str(2**30)}
SCANS = {"naive": naive_scan, "tiled": scan}
N_LAYER = 12   # the residual scaling 1 / sqrt(L) of the authors' 12-layer models


def rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class RTLayerStep(torch.nn.Module):
    """The RT's per-position work after attention, on the layer input x (B, N, d): a_t (B, H, hd) ->
    (k_t, v_t), each (B, H, hd); keeps z_t (the layer's output) in `self.z`."""

    def __init__(self, d: int, heads: int, x: torch.Tensor):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        mat = lambda i, o: torch.nn.Parameter(torch.randn(i, o, generator=g) / math.sqrt(i))  # noqa: E731
        self.wo, self.w1, self.w2, self.wk, self.wv = mat(d, d), mat(d, 4 * d), mat(4 * d, d), mat(d, d), mat(d, d)
        self.heads, self.x, self.z = heads, x, []

    def forward(self, t: int, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, H, hd = a.shape
        x = self.x[:, t]                                                  # (B, d)
        a = a.reshape(B, H * hd) @ self.wo                                # (B, d)
        mlp = F.gelu(rms(x + a / math.sqrt(N_LAYER)) @ self.w1) @ self.w2
        z = x + (a + mlp) / math.sqrt(N_LAYER)                            # (B, d): the layer output
        self.z.append(z)
        zn = rms(z)
        return rms((zn @ self.wk).view(B, H, hd)), (zn @ self.wv).view(B, H, hd)


def cell(kind: str, N: int, B: int, H: int, hd: int, grad: bool):
    """A fresh (inputs, step) for one timed run: q, k_tmp, v_tmp (B, H, N, hd) and the step."""
    g = torch.Generator().manual_seed(N)
    q, k_tmp, v_tmp = (rms(torch.randn(B, H, N, hd, generator=g)).requires_grad_(grad) for _ in range(3))
    x = torch.randn(B, N, H * hd, generator=g)
    step = RTLayerStep(H * hd, H, x) if kind == "RT layer" else (lambda t, a: (a, a))
    return (q, k_tmp, v_tmp), step


def run_once(fn, kind: str, N: int, shape: tuple[int, int, int], backward: bool) -> float:
    """Seconds of one scan (and its backward)."""
    (q, k_tmp, v_tmp), step = cell(kind, N, *shape, grad=backward)
    t0 = time.perf_counter()
    with torch.set_grad_enabled(backward):
        k, v = fn(q, k_tmp, v_tmp, step, scale=1 / math.sqrt(shape[2]))
        if backward:
            z = torch.stack(step.z, 1).sum() if isinstance(step, RTLayerStep) else 0.0
            (k.sum() + v.sum() + z).backward()
    return time.perf_counter() - t0


def measure(cells: list[tuple], shape: tuple[int, int, int], rounds: int) -> dict[tuple, float]:
    """Median seconds per cell (kind, N, scan, backward) over `rounds` rotated rounds after a warm-up."""
    times: dict[tuple, list[float]] = {c: [] for c in cells}
    for r in range(rounds + 1):
        for c in cells[r % len(cells):] + cells[:r % len(cells)]:
            kind, N, name, backward = c
            s = run_once(SCANS[name], kind, N, shape, backward)
            if r:
                times[c].append(s)
    return {c: statistics.median(t) for c, t in times.items()}


def key_reads(N: int) -> dict[str, int]:
    x = torch.zeros(1, 1, N, 1)
    out = {}
    with torch.no_grad():
        for name, fn in SCANS.items():
            counter: dict = {}
            fn(x, x, x, lambda t, a: (a, a), scale=1.0, counter=counter)
            out[name] = counter["key_reads"]
    return out


def report(med: dict[tuple, float], lengths: list[int], shape: tuple[int, int, int], modes: list[bool]) -> None:
    B, H, hd = shape
    print("| step | N | key reads naive (MB) | key reads tiled (MB) | naive / tiled reads | "
          + " | ".join(f"{m} ms naive | {m} ms tiled | {m} naive / tiled" for m in
                       ("fwd+bwd" if b else "fwd" for b in modes)) + " |")
    print("|---" * (5 + 3 * len(modes)) + "|")
    reads = {N: key_reads(N) for N in lengths}
    for kind in ("RT layer", "attention only"):
        for N in lengths:
            r = reads[N]
            mb = lambda n: 2 * n * B * H * hd * 4 / 2**20  # noqa: E731  (k and v, fp32)
            cols = [f"{r['naive']:,} ({mb(r['naive']):.0f})", f"{r['tiled']:,} ({mb(r['tiled']):.1f})",
                    f"{r['naive'] / r['tiled']:.1f}"]
            for b in modes:
                naive, tiled = med[(kind, N, "naive", b)], med[(kind, N, "tiled", b)]
                cols += [f"{1e3 * naive:.0f}", f"{1e3 * tiled:.0f}", f"{naive / tiled:.2f}"]
            print(f"| {kind} | {N} | " + " | ".join(cols) + " |")
    for N in lengths:
        want = N // 2 * int(math.log2(N)) if N & (N - 1) == 0 else sum(t & -t for t in range(1, N))
        print(f"N={N}: tiled key reads {reads[N]['tiled']:,} "
              f"{'==' if reads[N]['tiled'] == want else 'MISMATCH'} sum_(t<N) lowbit(t) = {want:,}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N = 16, 32 at H = 2, hd = 16, one round (smoke run)")
    p.add_argument("--lengths", default="256,512,1024", help="comma-separated N (default 256,512,1024)")
    p.add_argument("--rounds", type=int, default=3, help="timed rotated rounds after one warm-up (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--no-backward", action="store_true", help="time the forward (prefill) only")
    p.add_argument("--system-malloc", action="store_true", help="keep glibc's default malloc trimming")
    args = p.parse_args()
    try:
        lengths = [int(n) for n in ("16,32" if args.quick else args.lengths).split(",")]
    except ValueError:
        lengths = [0]
    for name, value in (("lengths", min(lengths)), ("rounds", args.rounds), ("threads", args.threads)):
        if value < 1:
            p.exit(2, f"rt_prefill.py: --{name}={getattr(args, name)} must be positive integer(s)\n")
    if not args.system_malloc and os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **_KEEP_FREED_MEMORY})
    torch.set_num_threads(args.threads)
    shape = (1, 2, 16) if args.quick else (1, 8, 64)
    rounds = 1 if args.quick else args.rounds
    modes = [False] if args.no_backward else [False, True]
    malloc = "glibc defaults" if args.system_malloc else "malloc keeps freed memory"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), fp32, B={shape[0]} H={shape[1]} "
          f"hd={shape[2]} (d={shape[1] * shape[2]}, RT-layer step MLP 4d, L={N_LAYER}), {rounds} rotated "
          f"round(s) after one warm-up, medians, {malloc}")
    t0 = time.perf_counter()
    cells = [(kind, N, name, b) for kind in ("RT layer", "attention only") for N in lengths
             for name in SCANS for b in modes]
    report(measure(cells, shape, rounds), lengths, shape, modes)
    print(f"\nwall {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
