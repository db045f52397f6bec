"""Generation latency and decoding memory of RecurrentGPT under each KV-cache strategy against its
isoFLOPs dense model (issue #6 item 4; paper Tables 3 and 4), everything measured in one run.

    .venv/bin/python benchmarks/generation.py            # CPU default: 3.3 minutes on 2 cores with
                                                         # inductor's on-disk cache warm, ~5 minutes cold
    .venv/bin/python benchmarks/generation.py --quick    # smoke run (5 s, eager only)
    .venv/bin/python benchmarks/generation.py --paper --full-size --device cuda --dtype bf16 --compile all
                                                         # the paper's setting (a GPU, not this CPU)

1. Latency and peak memory of generate() (prefill + greedy decode, batch 4): RecurrentGPT with the
   medium cell's layout 2+5x4+2 (24 block executions) under the `full`, `first`, `last`, `average`
   caches and without a cache, against a 24-layer dense GPT-2 of the same width, heads and vocabulary.
   CPU width by default (d=256); `--full-size` uses recurrentgpt-medium-isoflops vs gpt2-medium.
   The arms are interleaved, rotating which goes first; medians of REPEATS runs. Eager, then with the
   decode step compiled (`generate(compile_backend="inductor")`: a fixed-shape cache, one graph for
   every token, CUDA graphs on a GPU; the prefill stays eager). No-cache arms are not compiled.
   Compiling costs 30-80 s per arm on this CPU, so by default only the Table 3 pair (dense, recurrent
   `full`) is compiled; `--compile all` compiles every arm. A compile that fails, or that would start
   after the compile budget is spent, is reported with its reason. Target: latency(recurrent) /
   latency(dense) <= 1.10 in eager mode. The no-cache arms recompute the whole prefix for every token
   and generate only NO_CACHE_NEW tokens (128 would take about 50 s per call here).
   Memory: peak bytes of live tensors over one eager generate() (weights, K/V, activations,
   temporaries; `PeakMemory`, checked against torch's MemTracker in the same run), and the live cache's
   bytes at the end (`KVCache.nbytes`) next to the analytic `kv_cache_bytes`.
2. Decoding memory as in the paper's Table 4: weights + K/V in bf16 at T=1024, B=1 and B=32, for the
   full-size medium isoFLOPs cell under each strategy vs GPT-2 medium, from parameter counts (checked
   against a meta-device instantiation) and `kv_cache_bytes` (checked against real bf16 caches of the
   same layouts at a small width).

Decoding at batch 4 is a chain of tiny ops, each too short to amortise an OpenMP fork/join: with two
threads on this 2-core machine while another process used a core, eager decoding ran about 15x slower
(threads spin at barriers). The benchmark therefore runs single-threaded (`--threads`), and, like
benchmarks/model_throughput.py, re-executes itself with malloc tuned to keep freed memory.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import weakref
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rgpt_dist.sections import from_dict  # noqa: E402
from rgpt_dist.models.flavours import DENSE_REFERENCE, flavour  # noqa: E402
from rgpt_dist.models.config import ModelConfig  # noqa: E402
from rgpt_dist.flops import param_count  # noqa: E402
from rgpt_dist.models.generate import generate  # noqa: E402
from rgpt_dist.flops import kv_cache_bytes  # noqa: E402
from rgpt_dist.models.kv_cache import STRATEGIES  # noqa: E402
from rgpt_dist.models.spec import spec_for  # noqa: E402
from rgpt_dist.registry import build_model  # noqa: E402

SEED = 0
FLAVOUR = "recurrentgpt-medium-isoflops"          # 2+5x4+2, d=1024, 16 heads; dense: gpt2-medium (24 layers)
QUICK_FLAVOUR = "recurrentgpt-debug"              # 1+1x2+1, d=64; dense: gpt2-debug (4 layers)
CPU_WIDTH = dict(d_model=256, n_head=4, vocab_size=4096)   # default: the medium layouts at CPU width
QUICK_WIDTH = dict(vocab_size=512)
SHAPES = {"cpu": dict(batch=4, prompt=128, new=128),       # batch, prompt tokens, new tokens
          "paper": dict(batch=4, prompt=1024, new=128),
          "quick": dict(batch=2, prompt=16, new=8)}
NO_CACHE_NEW = 8                                           # new tokens of the no-cache arms
REPEATS = {"cpu": 3, "quick": 1}                           # timed generate() calls per arm (medians)
COMPILE_BUDGET_S = 240.0                                   # no compile starts after this many seconds of them
TARGET = 1.10                                              # eager latency ratio target (issue #6)
MEMORY_T, MEMORY_BATCHES = 1024, (1, 32)                   # Table 4: bf16, T=1024, B=1 and B=32
CHECK_WIDTH, CHECK_SHAPE = dict(d_model=64, n_head=4, vocab_size=256), dict(batch=2, prompt=20, new=5)
TRACKER_CHECK_NEW = 4                                      # tokens of the PeakMemory-vs-MemTracker check
PAPER_TABLE4 = "paper Table 4: 0.55x dense at B=1 with `full`; 0.91x at B=32 with `full`, 0.39x with `average`"
MB = 2 ** 20

ARMS = [("dense", "full"), *(("recurrent", s) for s in STRATEGIES), ("dense", None), ("recurrent", None)]
COMPILED = {"none": [], "pair": [("dense", "full"), ("recurrent", "full")], "all": ARMS}

# Serve large tensors from the heap and never trim it (values are bytes); see model_throughput.py.
_KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(2**35), "MALLOC_TRIM_THRESHOLD_": str(2**36),
                      "MALLOC_TOP_PAD_": str(2**30)}


# ---------------------------------------------------------------------------------------------- models

def configs(name: str, overrides: dict, block_size: int) -> tuple[ModelConfig, ModelConfig]:
    """(recurrent, dense) configs of a flavour and its isoFLOPs dense reference, with overrides."""
    rec = from_dict(ModelConfig, {**flavour(name), **overrides, "block_size": block_size}, "model")
    dense = from_dict(ModelConfig, {**flavour(DENSE_REFERENCE[name]), **overrides, "block_size": block_size}, "model")
    return rec, dense


def layout(cfg: ModelConfig) -> str:
    return spec_for(cfg).layout(cfg)


def arm_name(arm: tuple[str, str | None]) -> str:
    """arm: (model, strategy); strategy None = no cache (the whole prefix recomputed per token)."""
    model, strategy = arm
    if model == "dense":
        return "dense, cache" if strategy else "dense, no cache"
    return f"recurrent, {strategy}" if strategy else "recurrent, no cache"


def reference(arm: tuple[str, str | None]) -> tuple[str, str | None]:
    """The dense arm an arm's ratio is taken against: the cached one, or the no-cache one."""
    return ("dense", "full" if arm[1] else None)


@contextmanager
def capture_cache(model):
    """Keeps every cache `model.make_cache` returns (generate() makes one and does not return it)."""
    made, original = [], model.make_cache
    model.make_cache = lambda *a, **k: made.append(original(*a, **k)) or made[-1]
    try:
        yield made
    finally:
        del model.make_cache


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------- latency

def timed_generate(model, idx, new: int, strategy: str | None, backend: str | None = None) -> tuple[float, float]:
    """Seconds of one generate() (prefill + decode) and of the prefill alone (a separate forward)."""
    with torch.no_grad():
        sync(idx.device)
        t = time.perf_counter()
        model(idx, cache=None if strategy is None else model.make_cache(strategy))
        sync(idx.device)
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        generate(model, idx, new, strategy=strategy, compile_backend=backend)
        sync(idx.device)
    return time.perf_counter() - t, prefill


def interleaved(models: dict, arms: list, idx, news: dict, repeats: int, backend: str | None = None) -> dict:
    """Median (total, prefill) seconds per arm; arms interleaved, rotating which goes first."""
    runs: dict = {arm: [] for arm in arms}
    for i in range(repeats):
        k = i % len(arms)
        for arm in arms[k:] + arms[:k]:
            runs[arm].append(timed_generate(models[arm[0]], idx, news[arm], arm[1], backend))
    return {arm: (statistics.median(t for t, _ in v), statistics.median(p for _, p in v)) for arm, v in runs.items()}


def compile_arms(models: dict, arms: list, idx, news: dict, budget_s: float) -> tuple[list, dict, dict]:
    """Warms each arm's compiled decode step up (where compilation happens).
    Returns (arms that compiled, {arm: warm-up s}, {arm: why it is not measured})."""
    import torch._dynamo

    torch._dynamo.config.fail_on_recompile_limit_hit = True  # never time a silent fall-back to eager
    ok, warmup, skipped = [], {}, {}
    for arm in arms:
        if arm[1] is None:
            skipped[arm] = "not compiled: the compiled decode step needs a cache"
            continue
        if sum(warmup.values()) > budget_s:
            skipped[arm] = f"skipped: the compile budget of {budget_s:.0f} s is spent (--compile-budget)"
            continue
        t = time.perf_counter()
        try:
            timed_generate(models[arm[0]], idx, news[arm], arm[1], "inductor")
            ok.append(arm)
        except Exception as e:  # report, do not crash: compile support differs across torch versions
            skipped[arm] = f"compile failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
        warmup[arm] = time.perf_counter() - t
    return ok, warmup, skipped


# ---------------------------------------------------------------------------------------------- memory

class PeakMemory(TorchDispatchMode):
    """Peak bytes of live tensor storages inside the `with` block: the storages of `tensors` (weights,
    inputs) and of every op's outputs, each counted once until it is freed. MemTracker's accounting
    (weak references to storages) without its per-module snapshots, which made one default-size
    generate() take 37 s instead of about 5 (`tracker_check` compares the two)."""

    def __init__(self, tensors):
        super().__init__()
        self.live: dict[int, weakref.ref] = {}
        self.current = self.peak = 0
        for t in tensors:
            self._track(t)

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        if id(st) in self.live:
            return
        n = st.nbytes()

        def release(_, key=id(st), n=n):
            self.live.pop(key, None)
            self.current -= n

        self.live[id(st)] = weakref.ref(st, release)
        self.current += n
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


def peak_generate(model, idx, new: int, strategy: str | None) -> tuple[int, int]:
    """(peak bytes over one eager generate(), live cache bytes at its end)."""
    tracker = PeakMemory([*model.parameters(), *model.buffers(), idx])
    with capture_cache(model) as made, tracker:
        generate(model, idx, new, strategy=strategy)
    return tracker.peak, made[0].nbytes() if made else 0


class _Generation(torch.nn.Module):
    """One generate() as one root-module call: MemTracker refuses a second call of its root module,
    not of a submodule (the model, called once per token)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, new: int, strategy: str | None) -> torch.Tensor:
        return generate(self.model, idx, new, strategy=strategy)


def tracker_check(model, idx, new: int, strategy: str) -> tuple[int, int]:
    """(PeakMemory's peak, torch MemTracker's peak) over the same generate()."""
    from torch.distributed._tools.mem_tracker import MemTracker

    root = _Generation(model)
    tracker = MemTracker()
    tracker.track_external(root)
    with tracker:
        root(idx, new, strategy)
    theirs = sum(dev["Total"] for dev in tracker.get_tracker_snapshot("peak").values())
    return peak_generate(model, idx, new, strategy)[0], theirs


# ---------------------------------------------------------------------------------------------- tables

def latency_table(cfgs: dict, news: dict, eager: dict, compiled: dict, warmup: dict) -> list[str]:
    rows = ["| arm | layout | new tokens | eager ms | eager / dense | eager prefill ms | eager decode ms/token "
            "| compiled ms | compiled / dense | compiled decode ms/token | compile warm-up s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        (total, prefill), ref = eager[arm], reference(arm)
        ratio = total / eager[ref][0]
        mark = f" **<= {TARGET:.2f}**" if arm[0] == "recurrent" and arm[1] and ratio <= TARGET else ""
        cells = ["n/a"] * 3
        if arm in compiled and ref in compiled:
            c_total, c_prefill = compiled[arm]
            cells = [f"{c_total * 1e3:.0f}", f"{c_total / compiled[ref][0]:.3f}",
                     f"{(c_total - c_prefill) / (news[arm] - 1) * 1e3:.1f}"]
        warm = f"{warmup[arm]:.0f}" if arm in warmup else "-"
        rows.append(f"| {arm_name(arm)} | {layout(cfgs[arm[0]])} | {news[arm]} | {total * 1e3:.0f} | {ratio:.3f}{mark} | "
                    f"{prefill * 1e3:.0f} | {(total - prefill) / (news[arm] - 1) * 1e3:.1f} | {' | '.join(cells)} | {warm} |")
    return rows


def live_memory_table(cfgs: dict, models: dict, news: dict, memory: dict, shape: dict, elem: int) -> list[str]:
    rows = ["| arm | weights MB | peak MB | peak / dense | KV live MB (cache.nbytes) | KV analytic MB (kv_cache_bytes) |",
            "|---|---|---|---|---|---|"]
    for arm in ARMS:
        model, strategy = arm
        weights = sum(p.numel() * p.element_size() for p in models[model].parameters())
        peak, live = memory[arm]
        tokens = shape["prompt"] + news[arm] - 1
        analytic = kv_cache_bytes(cfgs[model], shape["batch"], tokens, strategy, dtype_bytes=elem) if strategy else 0
        check = "" if live == analytic else " (MISMATCH)"
        kv = f"{live / MB:.2f} | {analytic / MB:.2f}{check}" if strategy else "- | -"
        rows.append(f"| {arm_name(arm)} | {weights / MB:.2f} | {peak / MB:.2f} | {peak / memory[reference(arm)][0]:.2f} | {kv} |")
    return rows


def decoding_memory_table() -> list[str]:
    """Paper Table 4: weights + K/V (bf16, T=1024) of the full-size medium isoFLOPs cell vs GPT-2 medium."""
    rec, dense = configs(FLAVOUR, {}, MEMORY_T)
    head = " | ".join(f"KV B={b} MB | total B={b} MB (/ dense)" for b in MEMORY_BATCHES)
    rows = [f"| model | K/V cache | params | weights MB | {head} |", "|---|---|---|---|" + "---|---|" * len(MEMORY_BATCHES)]
    dense_total = {b: 2 * param_count(dense) + kv_cache_bytes(dense, b, MEMORY_T) for b in MEMORY_BATCHES}
    for cfg, strategy in [(dense, "full")] + [(rec, s) for s in STRATEGIES]:
        name = f"{DENSE_REFERENCE[FLAVOUR] if cfg is dense else FLAVOUR} {layout(cfg)}"
        weights, cells = 2 * param_count(cfg), []
        for b in MEMORY_BATCHES:
            kv = kv_cache_bytes(cfg, b, MEMORY_T, strategy)
            cells.append(f"{kv / MB:,.0f} | {(weights + kv) / MB:,.0f} ({(weights + kv) / dense_total[b]:.2f}x)")
        rows.append(f"| {name} | {strategy if cfg is rec else 'per layer'} | {param_count(cfg) / 1e6:.1f}M | "
                    f"{weights / MB:,.0f} | {' | '.join(cells)} |")
    return rows


def decoding_memory_checks() -> list[str]:
    """param_count against a meta-device instantiation; kv_cache_bytes against real bf16 caches of the
    medium layouts at a small width after a prefill and single-token decode steps."""
    lines = []
    for cfg in configs(FLAVOUR, {}, MEMORY_T):
        with torch.device("meta"):
            counted = sum(p.numel() for p in build_model(cfg).parameters())
        lines.append(f"- {layout(cfg)}: param_count {param_count(cfg):,} vs meta-device instantiation {counted:,}: "
                     f"{'match' if counted == param_count(cfg) else 'MISMATCH'}")
    B, P, N = CHECK_SHAPE["batch"], CHECK_SHAPE["prompt"], CHECK_SHAPE["new"]
    rec, dense = configs(FLAVOUR, CHECK_WIDTH, P + N)
    idx = torch.randint(0, CHECK_WIDTH["vocab_size"], (B, P), generator=torch.Generator().manual_seed(SEED))
    for cfg, strategy in [(dense, "full")] + [(rec, s) for s in STRATEGIES]:
        model = build_model(cfg, seed=SEED).to(torch.bfloat16)
        with capture_cache(model) as made:
            generate(model, idx, N, strategy=strategy)
        live, analytic = made[0].nbytes(), kv_cache_bytes(cfg, B, P + N - 1, strategy)
        lines.append(f"- {layout(cfg)} `{strategy}`, d={cfg.d_model}, B={B}, T={P + N - 1}, bf16: live cache "
                     f"{live:,} B, kv_cache_bytes {analytic:,} B: {'match' if live == analytic else 'MISMATCH'}")
    return lines


# ------------------------------------------------------------------------------------------------ main

def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny models and shapes, one repeat, eager only")
    p.add_argument("--paper", action="store_true", help="the paper's shapes: prompt 1024, 128 new tokens")
    p.add_argument("--full-size", action="store_true", help=f"{FLAVOUR} vs {DENSE_REFERENCE[FLAVOUR]} at full width")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per arm (default 3, quick 1)")
    p.add_argument("--compile", choices=tuple(COMPILED), default=None,
                   help="arms to also measure compiled (default: pair = dense and recurrent `full`; quick: none)")
    p.add_argument("--compile-budget", type=float, default=COMPILE_BUDGET_S,
                   help="seconds of compilation after which no further arm is compiled")
    p.add_argument("--no-cache-new", type=int, default=NO_CACHE_NEW, help="new tokens of the no-cache arms")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: see above)")
    p.add_argument("--system-malloc", action="store_true", help="keep glibc's default malloc trimming")
    args = p.parse_args()
    args.compile = args.compile or ("none" if args.quick else "pair")
    args.repeats = args.repeats or REPEATS["quick" if args.quick else "cpu"]
    return args


def setup(args) -> tuple[dict, dict, dict, dict, dict]:
    """Configs and the models keyed 'recurrent' / 'dense'; the shape; new tokens per arm."""
    shape = SHAPES["quick" if args.quick else "paper" if args.paper else "cpu"]
    name, width = (QUICK_FLAVOUR, QUICK_WIDTH) if args.quick else (FLAVOUR, {} if args.full_size else CPU_WIDTH)
    rec, dense = configs(name, width, shape["prompt"] + shape["new"])
    cfgs = {"recurrent": rec, "dense": dense}
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]

    def make(key):
        return build_model(cfgs[key], seed=SEED).to(args.device, dtype).eval()

    news = {arm: shape["new"] if arm[1] else min(shape["new"], args.no_cache_new) for arm in ARMS}
    return cfgs, {k: make(k) for k in cfgs}, shape, news


def main() -> None:
    args = parse_args()
    if not args.system_malloc and os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **_KEEP_FREED_MEMORY})
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    cfgs, models, shape, news = setup(args)
    idx = torch.randint(0, cfgs["dense"].vocab_size, (shape["batch"], shape["prompt"]),
                        generator=torch.Generator().manual_seed(SEED)).to(args.device)
    for arm in ARMS:  # warm-up: allocator, kernels, SDPA dispatch
        timed_generate(models[arm[0]], idx, min(news[arm], 4), arm[1])
    eager = interleaved(models, ARMS, idx, news, args.repeats)
    memory = {arm: peak_generate(models[arm[0]], idx, news[arm], arm[1]) for arm in ARMS}
    check = tracker_check(models["dense"], idx, TRACKER_CHECK_NEW, "full")
    eager_s = time.perf_counter() - start
    ok, warmup, skipped = compile_arms(models, COMPILED[args.compile], idx, news, args.compile_budget) \
        if COMPILED[args.compile] else ([], {}, {})
    compiled = interleaved(models, ok, idx, news, args.repeats, "inductor") if ok else {}
    report(args, cfgs, models, shape, news, eager, compiled, warmup, skipped, memory, check)
    print(f"\nwall time {time.perf_counter() - start:.0f} s (eager timing and memory {eager_s:.0f} s, "
          f"compile warm-ups {sum(warmup.values()):.0f} s)")


def report(args, cfgs, models, shape, news, eager, compiled, warmup, skipped, memory, check) -> None:
    B, P, N = shape["batch"], shape["prompt"], shape["new"]
    rec = cfgs["recurrent"]
    malloc = "glibc defaults" if args.system_malloc else "malloc keeps freed memory"
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} thread(s), {args.dtype}, {malloc}")
    print(f"recurrent {layout(rec)} vs dense {layout(cfgs['dense'])}: d={rec.d_model}, {rec.n_head} heads, "
          f"vocab {rec.vocab_size}; B={B}, prompt {P}, greedy; medians of {args.repeats}, arms interleaved")
    print("\n## 1a. Generation latency: generate() = prefill + decode\n")
    print("\n".join(latency_table(cfgs, news, eager, compiled, warmup)))
    print(f"\nRatios: against the dense arm of the same kind (cache / no cache) in the same mode. "
          "decode ms/token = (generate - prefill alone) / (new tokens - 1).")
    meets = [s for s in STRATEGIES if eager[("recurrent", s)][0] / eager[("dense", "full")][0] <= TARGET]
    print(f"Eager target latency(recurrent) / latency(dense) <= {TARGET:.2f}: met by {', '.join(meets) or 'no strategy'}"
          f"; not met by {', '.join(s for s in STRATEGIES if s not in meets) or 'none'}.")
    not_compiled = [f"`{arm_name(a)}`" for a in ARMS if a not in COMPILED[args.compile]]
    if not_compiled:
        print(f"Not compiled (--compile {args.compile}; each arm costs 30-80 s of compilation on this CPU): "
              f"{', '.join(not_compiled)}.")
    for arm, reason in skipped.items():
        print(f"Compiled {arm_name(arm)}: {reason}")
    print(f"\n## 1b. Memory of one eager generate() ({args.dtype}; peak = live tensors, weights included)\n")
    print("\n".join(live_memory_table(cfgs, models, news, memory, shape, torch.finfo(
        next(models['dense'].parameters()).dtype).bits // 8)))
    print(f"\nPeak tracker check (dense, cache, {TRACKER_CHECK_NEW} new tokens): PeakMemory {check[0]:,} B, "
          f"torch MemTracker {check[1]:,} B ({check[0] / check[1]:.3f}).")
    print(f"\n## 2. Decoding memory, {FLAVOUR} vs {DENSE_REFERENCE[FLAVOUR]} (bf16, T={MEMORY_T}, "
          "weights + K/V, analytic)\n")
    print("\n".join(decoding_memory_table()))
    print(f"\n{PAPER_TABLE4}.")
    print("\n".join(decoding_memory_checks()))


if __name__ == "__main__":
    main()
