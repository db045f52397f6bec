"""One-shot GPU measurement suite for a session lent one NVIDIA H200 (~15 minutes of device time).

    OUT=$OUT python3 benchmarks/gpu_suite.py --budget-s 480      # the remote run: ONE command (timeout_s 570)
    .venv/bin/python benchmarks/gpu_suite.py --quick             # CPU smoke run, tiny models (~15 s)

Needs only a python3 with CUDA torch, PyYAML and this checkout (no venv, no DeepSpeed; the device image
has PyYAML, which transformers requires); without torch it leaves {"meta": {"error": ...}} and exits 1. --budget-s 300 when less device time is left.
Sections, in run order (keys of "sections" in $OUT/gpu_suite.json; OUT defaults to ./gpu_out):
  environment          torch/CUDA/cuDNN, device, memory, bf16, which SDPA backends (flash, efficient, cudnn,
                       math) run a causal bf16 call and their forward ms, the MFU peak (datasheet bf16)
  train                train step + fused AdamW, gpt2-medium vs recurrentgpt-medium-isoflops (2+5x4+2), seq
                       1024, micro-batch 8, checkpointing none / recurrence, noise on, r = R / r ~ U{1..R}:
                       step ms, tokens/s, MFU (Eq. 1), HFU (+ recompute FLOPs), peak memory; bf16 parameters
                       (as DeepSpeed's bf16 runs the model) plus two arms under torch.autocast
  time_ratio           fwd+bwd of the isoFLOPs pair interleaved A/B at r = R: FLOP-normalised time ratio
  generation           generate(), B=4, prompt 1024, 128 new tokens, bf16, eager: dense, every KV strategy,
                       no cache: latency, ratio to dense, peak memory
  compile              recurrent train step at r = R, torch.compile (default mode) vs eager: first-step
                       (compile) s, speedup, graph breaks
  generation_compiled  every cached arm's generate() with a compiled fixed-shape decode step (compile_backend)
Each section runs in try/except (error recorded, next section runs); the budget is checked before each and
a SIGALRM at its end (or the section's cap) interrupts whatever runs; the JSON is rewritten before and
after every section. Without CUDA (and without --quick) every section but environment is skipped.
Afterwards: paste the markdown printed at the end into docs/performance.md under a heading "H200, bf16"
with the date and environment line, noting any section's error or skip; keep the JSON with the issue.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
OUT = Path(os.environ.get("OUT") or "gpu_out")
try:
    import torch
except ImportError as exc:  # nothing to measure, but leave a record
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gpu_suite.json").write_text(json.dumps({"meta": {"error": f"torch is not importable: {exc}"}}))
    sys.exit(f"gpu_suite: torch is not importable ({exc})")

from rgpt_dist.sections import from_dict  # noqa: E402
from rgpt_dist.models.flavours import flavour  # noqa: E402
from rgpt_dist.models.config import ModelConfig  # noqa: E402
from rgpt_dist.flops import executed_forward_flops, forward_flops, head_flops, recompute_flops  # noqa: E402
from rgpt_dist.models.generate import generate  # noqa: E402
from rgpt_dist.models.kv_cache import STRATEGIES  # noqa: E402
from rgpt_dist.models.spec import spec_for  # noqa: E402
from rgpt_dist.noise import NoiseKey  # noqa: E402
from rgpt_dist.parallel.checkpointing import apply_activation_checkpointing  # noqa: E402
from rgpt_dist.registry import build_model  # noqa: E402
from rgpt_dist.train.metrics import peak_flops  # noqa: E402

SIZES = {  # pair, vocabulary (None: GPT-2's), train shape, steps, generation shape, repeats, SDPA probe shape
    "full": dict(dense="gpt2-medium", recurrent="recurrentgpt-medium-isoflops", vocab=None, seq=1024, batch=8,
                 warmup=3, steps=10, gen_batch=4, prompt=1024, new=128, repeats=3, sdpa=(8, 16, 1024, 64)),
    "quick": dict(dense="gpt2-debug", recurrent="recurrentgpt-debug", vocab=256, seq=32, batch=2,
                  warmup=1, steps=2, gen_batch=2, prompt=16, new=4, repeats=1, sdpa=(1, 2, 16, 8)),
}
TRAIN_ARMS = [("dense", "none", "fixed"), ("recurrent", "none", "fixed"), ("recurrent", "none", "sampled"),
              ("dense", "recurrence", "fixed"), ("recurrent", "recurrence", "fixed"),
              ("recurrent", "recurrence", "sampled")]
GEN_ARMS = [("dense", "full"), *(("recurrent", s) for s in STRATEGIES), ("dense", None), ("recurrent", None)]
CAPS_S = {"compile": 200.0, "generation_compiled": 150.0}  # a section's own limit, within the budget
PRECISIONS = {"bf16": "bf16 parameters, as DeepSpeed's bf16 mode runs the model (no fp32 master copy here)",
              "autocast": "torch.autocast(bfloat16) over fp32 parameters"}
MIN_START_S = 15.0                                          # no section starts with less (or 5% of the budget)
MB = 2 ** 20


class BudgetExceeded(BaseException):
    """Raised by SIGALRM; a BaseException so that no library's `except Exception` swallows it."""


class Ctx:
    """What every section needs: arguments, device, sizes, the deadline, the MFU peak."""

    def __init__(self, args):
        self.args, self.quick = args, args.quick
        self.device = torch.device(args.device or ("cpu" if args.quick else "cuda"))
        self.cuda = self.device.type == "cuda"
        self.size = SIZES["quick" if args.quick else "full"]
        self.precision = args.precision
        self.start = time.monotonic()
        self.deadline = self.start + args.budget_s
        self.peak, self.peak_source = None, None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def timed(self, fn) -> float:
        """Seconds of fn(), the device synchronised before and after."""
        sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        sync()
        t = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t

    def reset_peak(self) -> int:
        """Starts a peak-memory window; returns the bytes allocated now (0 on CPU)."""
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() if self.cuda else 0

    def peak_mb(self, base: int = 0) -> float | None:
        return (torch.cuda.max_memory_allocated() - base) / MB if self.cuda else None


def configs(ctx: Ctx, block_size: int) -> dict[str, ModelConfig]:
    extra = {"block_size": block_size, **({"vocab_size": ctx.size["vocab"]} if ctx.size["vocab"] else {})}
    return {kind: from_dict(ModelConfig, {**flavour(ctx.size[kind]), **extra}, "model")
            for kind in ("dense", "recurrent")}


def build(ctx: Ctx, cfg: ModelConfig, precision: str | None = None):
    """The model on the device; bf16 parameters unless the precision is autocast (fp32 parameters)."""
    with torch.device(ctx.device):  # initialise on the device: no host-side init of 355M parameters
        model = build_model(cfg, seed=0)
    return model if (precision or ctx.precision) == "autocast" else model.to(torch.bfloat16)


def batch(ctx: Ctx, cfg: ModelConfig, B: int, S: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, cfg.vocab_size, (B, S + 1), generator=torch.Generator().manual_seed(0)).to(ctx.device)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def train_step(ctx: Ctx, model, opt, idx, tgt, r: int | None, key: NoiseKey, precision: str | None = None) -> None:
    """Forward (bf16 autocast if asked), backward, and the optimizer step (opt None: gradients dropped)."""
    kwargs = {} if r is None else {"r": r, "noise_key": key}
    with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=(precision or ctx.precision) == "autocast"):
        loss = model(idx, tgt, **kwargs).loss
    loss.backward()
    if opt is not None:
        opt.step()
    (opt or model).zero_grad(set_to_none=True)


def adamw(ctx: Ctx, model):
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=ctx.cuda)


def free(ctx: Ctx) -> None:
    gc.collect()
    try:
        torch.cuda.empty_cache() if ctx.cuda else None
    except Exception:  # a poisoned CUDA context fails here too; the next section records it
        pass


def layout(cfg: ModelConfig) -> str:
    return spec_for(cfg).layout(cfg)


def arm_name(kind: str, strategy: str | None) -> str:
    return f"{kind}/{strategy or 'no-cache'}"


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def section_environment(ctx: Ctx, res: dict) -> None:
    res.update(torch=torch.__version__, cuda_build=torch.version.cuda, python=sys.version.split()[0],
               cpu_count=os.cpu_count(), cuda_available=torch.cuda.is_available(), device=str(ctx.device))
    if ctx.cuda and not torch.cuda.is_available():
        res["sdpa"] = {}  # not probed: CUDA is not available
        return
    if ctx.cuda:
        props = torch.cuda.get_device_properties(0)
        res.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                   memory_gib=props.total_memory / 2**30, gpus=torch.cuda.device_count(),
                   bf16=torch.cuda.is_bf16_supported(), cudnn=torch.backends.cudnn.version())
    ctx.peak, ctx.peak_source = peak_flops("bf16")
    if ctx.cuda and "datasheet" not in ctx.peak_source:  # unknown GPU: a bf16 matmul timed here
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        ctx.peak = 2 * 8192 ** 3 / min(ctx.timed(lambda: a @ a) for _ in range(5))
        ctx.peak_source = "measured bf16 8192^3 matmul"
    res.update(peak_flops=ctx.peak, peak_source=ctx.peak_source)
    res["sdpa"] = sdpa_backends(ctx)


def sdpa_backends(ctx: Ctx) -> dict:
    """Which SDPA backends run a causal bf16 call here, each forced alone, and its forward ms."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(ctx.size["sdpa"], device=ctx.device, dtype=torch.bfloat16) for _ in range(3))
    out = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        if not hasattr(SDPBackend, name):
            out[name.lower()] = {"ok": False, "error": "not in this torch"}
            continue
        try:
            with sdpa_kernel([getattr(SDPBackend, name)]):
                call = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                call()
                out[name.lower()] = {"ok": True, "fwd_ms": 1e3 * statistics.median(ctx.timed(call) for _ in range(5))}
        except Exception as e:  # "No available kernel" and the like
            out[name.lower()] = {"ok": False, "error": first_line(e)}
    return out


def train_arm(ctx: Ctx, cfg: ModelConfig, mode: str, depth: str, precision: str) -> dict:
    S, B, W, N = (ctx.size[k] for k in ("seq", "batch", "warmup", "steps"))
    model = build(ctx, cfg, precision)
    apply_activation_checkpointing(model, mode)
    opt, sampler = adamw(ctx, model), spec_for(cfg).depth_sampler(cfg)
    idx, tgt = batch(ctx, cfg, B, S)
    times, model_flops, hw_flops, depths = [], 0.0, 0.0, []
    base = ctx.reset_peak()
    for step in range(W + N):
        r = None if sampler is None else (cfg.n_loops if depth == "fixed" else sampler(0, step))
        t = ctx.timed(lambda: train_step(ctx, model, opt, idx, tgt, r, NoiseKey(seed=0, step=step), precision))
        if step >= W:
            times.append(t)
            depths.append(r)
            flops = 3 * (forward_flops(cfg, S, r) + head_flops(cfg)) * B * S
            model_flops, hw_flops = model_flops + flops, hw_flops + flops + recompute_flops(cfg, S, r, mode) * B * S
    total = sum(times)
    return {"micro_batch": B, "seq": S, "mean_r": None if sampler is None else statistics.mean(depths),
            "step_ms_median": 1e3 * statistics.median(times), "step_ms_mean": 1e3 * total / N,
            "tokens_per_s": B * S * N / total, "mfu": model_flops / total / ctx.peak,
            "hfu": hw_flops / total / ctx.peak, "peak_mb": ctx.peak_mb(base)}


def section_train(ctx: Ctx, res: dict) -> None:
    cfgs = configs(ctx, ctx.size["seq"])
    if ctx.peak is None:  # the environment section failed before setting it
        ctx.peak, ctx.peak_source = peak_flops("bf16")
    other = "bf16" if ctx.precision == "autocast" else "autocast"
    res.update(precision=PRECISIONS[ctx.precision], other_precision=PRECISIONS[other], optimizer="AdamW, fused on CUDA",
               peak_flops=ctx.peak, layouts={k: layout(c) for k, c in cfgs.items()}, arms={})
    for kind, mode, depth, precision in [(*arm, ctx.precision) for arm in TRAIN_ARMS] + [
            ("dense", "none", "fixed", other), ("recurrent", "none", "fixed", other)]:
        name = f"{kind}/{mode}" + (f"/r={depth}" if kind == "recurrent" else "") + (f"/{other}" if precision == other else "")
        try:
            res["arms"][name] = train_arm(ctx, cfgs[kind], mode, depth, precision)
        except Exception as e:  # an OOM or a kernel failure costs this arm only
            res["arms"][name] = {"error": first_line(e)}
        free(ctx)


def section_time_ratio(ctx: Ctx, res: dict) -> None:
    S, B, W, N = (ctx.size[k] for k in ("seq", "batch", "warmup", "steps"))
    cfgs = configs(ctx, S)
    models = {k: build(ctx, c) for k, c in cfgs.items()}
    depth = {"dense": None, "recurrent": cfgs["recurrent"].n_loops}
    idx, tgt = batch(ctx, cfgs["dense"], B, S)

    times: dict[str, list[float]] = {"dense": [], "recurrent": []}
    for i in range(W + N):  # interleaved A/B, alternating which goes first
        for kind in (("dense", "recurrent") if i % 2 == 0 else ("recurrent", "dense")):
            t = ctx.timed(lambda: train_step(ctx, models[kind], None, idx, tgt, depth[kind], NoiseKey(seed=0, step=i)))
            times[kind].extend([t] if i >= W else [])
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    eq1 = {k: forward_flops(c, S) + head_flops(c) for k, c in cfgs.items()}
    executed = {k: executed_forward_flops(c, S) + head_flops(c) for k, c in cfgs.items()}
    time_ratio, flops_ratio = ms["recurrent"] / ms["dense"], eq1["recurrent"] / eq1["dense"]
    res.update(micro_batch=B, seq=S, dense_ms=ms["dense"], recurrent_ms=ms["recurrent"], time_ratio=time_ratio,
               eq1_flops_ratio=flops_ratio, executed_flops_ratio=executed["recurrent"] / executed["dense"],
               flop_normalised_ratio=time_ratio / flops_ratio)


def gen_setup(ctx: Ctx):
    P, new, B = ctx.size["prompt"], ctx.size["new"], ctx.size["gen_batch"]
    cfgs = configs(ctx, P + new)  # positions for the prompt and every new token
    models = {k: build(ctx, c, "bf16").eval() for k, c in cfgs.items()}
    prompt = batch(ctx, cfgs["dense"], B, P)[0]
    return models, prompt, new


def gen_latencies(ctx: Ctx, models: dict, prompt, new: int, arms: list, res: dict, backend: str | None = None) -> None:
    """Per arm: one warm-up call (peak memory, or compile time), then medians of interleaved repeats.
    backend: generate()'s compile_backend (a compiled fixed-shape decode step), or None (eager)."""
    run = lambda kind, strategy: generate(models[kind], prompt, new, strategy=strategy, compile_backend=backend)  # noqa: E731
    for kind, strategy in arms:
        base = ctx.reset_peak()
        warmup = ctx.timed(lambda: run(kind, strategy))
        res[arm_name(kind, strategy)] = {"warmup_s": warmup, "peak_mb": ctx.peak_mb(base),
                                         "weights_mb": sum(p.nbytes for p in models[kind].parameters()) / MB}
    times: dict[str, list[float]] = {arm_name(*a): [] for a in arms}
    for i in range(ctx.size["repeats"]):
        for kind, strategy in arms[i % len(arms):] + arms[:i % len(arms)]:
            times[arm_name(kind, strategy)].append(ctx.timed(lambda: run(kind, strategy)))
    for (kind, strategy), name in zip(arms, times):
        ref = arm_name("dense", "full" if strategy else None)
        res[name]["ms"] = 1e3 * statistics.median(times[name])
        res[name]["ratio_to_dense"] = res[name]["ms"] / (1e3 * statistics.median(times[ref])) if ref in times else None
        if ctx.cuda and res.get(ref, {}).get("peak_mb"):
            res[name]["peak_ratio_to_dense"] = ((res[name]["peak_mb"] + res[name]["weights_mb"])
                                                / (res[ref]["peak_mb"] + res[ref]["weights_mb"]))


def section_generation(ctx: Ctx, res: dict) -> None:
    models, prompt, new = gen_setup(ctx)
    res.update(batch=prompt.shape[0], prompt=prompt.shape[1], new_tokens=new, dtype="bf16 weights", arms={},
               note="peak_mb: above what was allocated before the call (weights excluded); ratios add weights")
    gen_latencies(ctx, models, prompt, new, GEN_ARMS, res["arms"])


def section_compile(ctx: Ctx, res: dict) -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    S, B, W, N = (ctx.size[k] for k in ("seq", "batch", "warmup", "steps"))
    cfg = configs(ctx, S)["recurrent"]
    idx, tgt, R = *batch(ctx, cfg, B, S), cfg.n_loops
    key = NoiseKey(seed=0, step=0)  # one key for every step: a new key per step would be a new guard
    res.update(model=layout(cfg), r=R, backend=ctx.args.compile_backend, micro_batch=B, seq=S,
               note="checkpointing none, fixed noise key, eager and compiled measured one after the other")
    for label in ("eager", "compiled"):
        torch._dynamo.reset()
        counters.clear()
        model = build(ctx, cfg)
        run = torch.compile(model, backend=ctx.args.compile_backend) if label == "compiled" else model
        opt, base = adamw(ctx, model), ctx.reset_peak()
        first = ctx.timed(lambda: train_step(ctx, run, opt, idx, tgt, R, key))
        warm = sum(ctx.timed(lambda: train_step(ctx, run, opt, idx, tgt, R, key)) for _ in range(W))
        times = [ctx.timed(lambda: train_step(ctx, run, opt, idx, tgt, R, key)) for _ in range(N)]
        res[label] = {"first_step_s": first, "warmup_s": first + warm, "step_ms": 1e3 * statistics.median(times),
                      "peak_mb": ctx.peak_mb(base)}
        if label == "compiled":
            res[label].update(graph_breaks=sum(counters["graph_break"].values()),
                              graph_break_reasons=[str(k)[:160] for k in list(counters["graph_break"])[:5]],
                              unique_graphs=counters["stats"].get("unique_graphs"))
        del model, run, opt
        free(ctx)
    res["speedup"] = res["eager"]["step_ms"] / res["compiled"]["step_ms"]


def section_generation_compiled(ctx: Ctx, res: dict) -> None:
    """generate(compile_backend=...): the fixed-shape decode step compiled (CUDA graphs with inductor
    on CUDA), the prefill eager; every cached arm."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        torch._dynamo.config.fail_on_recompile_limit_hit = True  # never time a silent fall-back to eager
    models, prompt, new = gen_setup(ctx)
    frames = counters["frames"]["ok"]
    res.update(batch=prompt.shape[0], prompt=prompt.shape[1], new_tokens=new, backend=ctx.args.compile_backend,
               note="warmup_s includes compilation (2 frames per arm expected); ratios against dense, compiled",
               arms={})
    gen_latencies(ctx, models, prompt, new, [a for a in GEN_ARMS if a[1]], res["arms"], ctx.args.compile_backend)
    res.update(frames_compiled=counters["frames"]["ok"] - frames, graph_breaks=sum(counters["graph_break"].values()))


SECTIONS = [("environment", section_environment), ("train", section_train), ("time_ratio", section_time_ratio),
            ("generation", section_generation), ("compile", section_compile),
            ("generation_compiled", section_generation_compiled)]


def _alarm(signum, frame):
    raise BudgetExceeded("the section ran past its time limit (budget or cap)")


def run_section(ctx: Ctx, name: str, fn, report: dict, path: Path) -> None:
    """Runs one section under its time limit; records results, a skip reason or the error."""
    entry = report["sections"][name] = {"status": "running", "results": {}}
    if name != "environment" and ctx.device.type == "cuda" and not torch.cuda.is_available():
        entry.update(status="skipped", reason="CUDA is not available (use --quick for the CPU smoke run)")
        return
    if ctx.left() < min(MIN_START_S, 0.05 * ctx.args.budget_s):
        entry.update(status="skipped", reason=f"budget spent ({ctx.left():.0f} s left of {ctx.args.budget_s:.0f})")
        return
    write_json(report, path)
    limit = min(ctx.left(), CAPS_S.get(name, float("inf")))
    t = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, max(limit, 1.0))
    try:
        fn(ctx, entry["results"])
        if ctx.args.hang_section == name:  # debug: proves the alarm ends a section that never returns
            time.sleep(10 ** 6)
        if ctx.args.fail_section == name:
            raise RuntimeError(f"injected failure (--fail-section {name})")
        entry["status"] = "ok"
    except BaseException as e:  # BudgetExceeded, errors, OOM: record and go on (not KeyboardInterrupt)
        if isinstance(e, KeyboardInterrupt):
            raise
        entry.update(status="error", error=first_line(e), traceback=traceback.format_exc()[-3000:])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        entry["elapsed_s"] = time.monotonic() - t
        free(ctx)


def write_json(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    os.replace(tmp, path)


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def summary(report: dict) -> str:
    """The markdown to paste into docs/performance.md."""
    sec = {k: v.get("results", {}) for k, v in report["sections"].items()}
    env, tr, comp = sec.get("environment", {}), sec.get("time_ratio", {}), sec.get("compile", {})
    out = [f"## GPU suite {report['meta']['started'][:10]}: {env.get('device_name', env.get('device'))}, torch "
           f"{env.get('torch')}, CUDA {env.get('cuda_build')}, precision {report['meta']['precision']}, MFU peak "
           f"{fmt(env.get('peak_flops'), '.3g')} FLOP/s ({env.get('peak_source')})", ""]
    out += [f"- {k}: **{v['status']}** {v.get('reason') or v.get('error', '')}"
            for k, v in report["sections"].items() if v["status"] != "ok"]
    if env.get("sdpa"):
        out += ["", "SDPA backends (causal bf16 forward): " + ", ".join(
            f"{k} {fmt(v['fwd_ms'], '.3f')} ms" if v.get("ok") else f"{k} no" for k, v in env["sdpa"].items())]
    out += table(["train arm", "B", "step ms", "tokens/s", "MFU", "HFU", "peak GB"], [
        [a, r["error"], "", "", "", "", ""] if "error" in r else
        [a, str(r["micro_batch"]), fmt(r["step_ms_median"]), fmt(r["tokens_per_s"], ",.0f"), fmt(100 * r["mfu"]) + "%",
         fmt(100 * r["hfu"]) + "%", fmt(r["peak_mb"] and r["peak_mb"] / 1024, ".2f")]
        for a, r in sec.get("train", {}).get("arms", {}).items()])
    if "flop_normalised_ratio" in tr:
        out += ["", f"fwd+bwd at r=R: dense {fmt(tr['dense_ms'])} ms, recurrent {fmt(tr['recurrent_ms'])} ms, time "
                    f"ratio {tr['time_ratio']:.3f}, Eq. 1 FLOPs ratio {tr['eq1_flops_ratio']:.3f}, FLOP-normalised "
                    f"**{tr['flop_normalised_ratio']:.3f}**"]
    if "speedup" in comp:
        c = comp["compiled"]
        out += ["", f"torch.compile ({comp['backend']}, {comp['model']}, r={comp['r']}): eager {fmt(comp['eager']['step_ms'])}"
                    f" ms, compiled {fmt(c['step_ms'])} ms, **{comp['speedup']:.2f}x**, first step {fmt(c['first_step_s'])} s,"
                    f" graph breaks {c['graph_breaks']}"]
    for key in ("generation", "generation_compiled"):
        out += table([f"{key} arm", "ms", "/ dense", "warm-up s", "peak MB above weights", "weights MB",
                      "peak + weights / dense"], [
            [a, fmt(r.get("ms"), ".0f"), fmt(r.get("ratio_to_dense"), ".3f"), fmt(r.get("warmup_s")),
             fmt(r.get("peak_mb"), ".0f"), fmt(r.get("weights_mb")), fmt(r.get("peak_ratio_to_dense"), ".2f")]
            for a, r in sec.get(key, {}).get("arms", {}).items()])
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget of the whole suite (default 480)")
    p.add_argument("--quick", action="store_true", help="tiny models on CPU: proves every code path in seconds")
    p.add_argument("--device", default=None, help="default: cuda (cpu with --quick)")
    p.add_argument("--sections", default=",".join(n for n, _ in SECTIONS), help="comma-separated subset, in order")
    p.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; eager with --quick)")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="bf16",
                   help="train/time_ratio/compile: bf16 parameters (default) or autocast over fp32 ones")
    p.add_argument("--fail-section", default=None, help="debug: raise at the end of this section")
    p.add_argument("--hang-section", default=None, help="debug: sleep at the end of this section until its limit")
    args = p.parse_args()
    args.compile_backend = args.compile_backend or ("eager" if args.quick else "inductor")
    ctx, path = Ctx(args), OUT / "gpu_suite.json"
    if ctx.cuda and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    report = {"meta": {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(), "argv": sys.argv[1:],
                       "quick": args.quick, "budget_s": args.budget_s, "device": str(ctx.device),
                       "sizes": ctx.size, "precision": args.precision, "finished": False}, "sections": {}}
    signal.signal(signal.SIGALRM, _alarm)
    chosen = args.sections.split(",")
    for name, fn in SECTIONS:
        if name in chosen:
            print(f"[gpu_suite {time.monotonic() - ctx.start:6.1f} s] {name} ...", flush=True)
            run_section(ctx, name, fn, report, path)
            report["meta"]["elapsed_s"] = time.monotonic() - ctx.start
            write_json(report, path)
    report["meta"]["finished"] = True
    write_json(report, path)
    try:
        print(summary(report), flush=True)
    except Exception:  # the JSON is written; a summary bug must not hide it
        traceback.print_exc()
    print(f"\nJSON: {path}", flush=True)
    os._exit(0)  # no wait on compile worker threads or pools an interrupted section may have left


if __name__ == "__main__":
    main()
