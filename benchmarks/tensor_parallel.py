"""Tensor and ZeRO data parallelism on CPU: per-rank memory and step time (issue #5).

    .venv/bin/python benchmarks/tensor_parallel.py            # about 4 minutes on 2 cores
    .venv/bin/python benchmarks/tensor_parallel.py --quick    # debug-sized smoke run (seconds)

1. Per-rank parameter bytes at tp = 2 vs tp = 1 for the medium and large layouts (megatron layers
   built on 2 gloo ranks; target <= 0.55).
2. Per-rank optimizer-state bytes (fp32 master partition + Adam moments) under DeepSpeed ZeRO-1 at
   dp = 2 vs dp = 1, after one optimizer step of the project's own engine (target <= 0.55).
3. Forward+backward step time at tp = 2 (2 processes, 1 thread each) vs tp = 1 (1 process,
   2 threads), medians (reported, no target: two ranks on two cores add no compute).
Every measurement runs in a fresh torchrun process group; rank 0 of each writes a JSON line.
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
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rgpt_dist.config import RecurrentGPTConfig, load_config  # noqa: E402
from rgpt_dist.registry import build_model  # noqa: E402

MEMORY_LAYOUTS = ["gpt2-medium", "recurrentgpt-medium-isoparams", "gpt2-large", "recurrentgpt-large-isoparams"]
ZERO_LAYOUT = "recurrentgpt-medium-isoflops"
STEP_MODEL = dict(vocab_size=8192, block_size=256, d_model=512, n_head=8, n_pre=1,
                  n_rec=2, n_loops=4, n_coda=1, pad_vocab_multiple=256)
STEP_SHAPE = dict(B=4, S=256, steps=8)


def tensor_bytes(tensors) -> int:
    """Bytes of distinct storages (views of one flat buffer count once)."""
    seen, total = set(), 0
    for t in tensors:
        if torch.is_tensor(t) and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    return total


def tp_model(cfg):
    """This rank's model: megatron layers when a process group of > 1 ranks exists."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return build_model(cfg, seed=0)
    from rgpt_dist.parallel.tensor_parallel import TensorParallelFactory, init_tensor_parallel

    init_tensor_parallel(dist.get_world_size())
    return build_model(cfg, factory=TensorParallelFactory())


def worker_params(flavour: str) -> dict:
    model = tp_model(load_config(flavour, ["model.pad_vocab_multiple=256"]).model)
    return {"param_bytes": tensor_bytes(model.parameters()), "params": sum(p.numel() for p in model.parameters())}


def worker_zero1(flavour: str) -> dict:
    """One optimizer step through the trainer's engine at ZeRO-1, fp32; the inner optimizer's
    parameters (the flat fp32 partition) and states (exp_avg, exp_avg_sq)."""
    from rgpt_dist.parallel.dims import ParallelDims
    from rgpt_dist.parallel.zero import init_engine
    from rgpt_dist.train.optim import make_optimizer, make_scheduler

    dp = int(os.environ.get("WORLD_SIZE", 1))
    cfg = load_config(None, [f"model.flavour={flavour}", "model.block_size=64", "parallel.zero_stage=1",
                             "parallel.dtype=fp32", "parallel.activation_checkpointing=none",
                             "train.micro_batch_size=1", f"train.global_batch_size={dp}", "train.seq_len=16"])
    model = build_model(cfg.model, seed=0)
    optimizer = make_optimizer(model, cfg.train)
    engine = init_engine(model, optimizer, make_scheduler(optimizer, cfg.train), cfg, ParallelDims.from_env())
    idx = torch.randint(0, cfg.model.vocab_size, (1, 17), generator=torch.Generator().manual_seed(0))
    engine.backward(engine(idx[:, :-1], idx[:, 1:], r=1).loss)
    engine.step()
    inner = engine.optimizer.optimizer  # DeepSpeedZeroOptimizer -> our AdamW over the fp32 partition
    state = [t for s in inner.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    params = [p for g in inner.param_groups for p in g["params"]]
    return {"optimizer_bytes": tensor_bytes(state + params), "model_params": sum(p.numel() for p in model.parameters())}


def worker_step() -> dict:
    from rgpt_dist.noise import NoiseKey

    model = tp_model(RecurrentGPTConfig(**STEP_MODEL)).train()
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, STEP_MODEL["vocab_size"], (STEP_SHAPE["B"], STEP_SHAPE["S"] + 1), generator=g)
    times = []
    for step in range(STEP_SHAPE["steps"] + 1):  # the first step warms up
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        model(idx[:, :-1], idx[:, 1:], noise_key=NoiseKey(seed=0, step=step)).loss.backward()
        times.append(time.perf_counter() - t)
    return {"step_s": statistics.median(times[1:]), "threads": torch.get_num_threads()}


def worker(kind: str, arg: str, out: str) -> None:
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 or kind == "zero1":
        dist.init_process_group("gloo")
    result = {"params": lambda: worker_params(arg), "zero1": lambda: worker_zero1(arg), "step": worker_step}[kind]()
    if int(os.environ.get("RANK", 0)) == 0:
        Path(out).write_text(json.dumps(result))
    if dist.is_initialized():
        dist.destroy_process_group()


def launch(kind: str, arg: str, nproc: int, threads: int) -> dict:
    """Run `worker(kind, arg)` on nproc torchrun processes with `threads` threads each."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               __file__, "--worker", kind, arg, str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT),
               "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".venv" / "torch_extensions"))}
        subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="debug-sized models (a smoke run)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(*args.worker)
    layouts = ["gpt2-debug", "recurrentgpt-debug"] if args.quick else MEMORY_LAYOUTS
    if args.quick:
        STEP_MODEL.update(d_model=64, n_head=4, vocab_size=512)
    print("| layout | parameters | tp=1 MB/rank | tp=2 MB/rank | ratio |\n|---|---|---|---|---|")
    for flavour in layouts:
        one, two = launch("params", flavour, 1, 2), launch("params", flavour, 2, 1)
        print(f"| {flavour} | {one['params'] / 1e6:.1f}M | {one['param_bytes'] / 2**20:.0f} | "
              f"{two['param_bytes'] / 2**20:.0f} | {two['param_bytes'] / one['param_bytes']:.3f} |")
    flavour = "recurrentgpt-debug" if args.quick else ZERO_LAYOUT
    one, two = launch("zero1", flavour, 1, 2), launch("zero1", flavour, 2, 1)
    print(f"\nZeRO-1 optimizer state per rank, {flavour} ({one['model_params'] / 1e6:.1f}M parameters): "
          f"dp=1 {one['optimizer_bytes'] / 2**20:.0f} MB, dp=2 {two['optimizer_bytes'] / 2**20:.0f} MB, "
          f"ratio {two['optimizer_bytes'] / one['optimizer_bytes']:.3f}")
    one, two = launch("step", "-", 1, 2), launch("step", "-", 2, 1)
    print(f"\nforward+backward, d={STEP_MODEL['d_model']} B={STEP_SHAPE['B']} S={STEP_SHAPE['S']}: tp=1 "
          f"({one['threads']} threads) {one['step_s'] * 1e3:.0f} ms, tp=2 ({two['threads']} thread each) "
          f"{two['step_s'] * 1e3:.0f} ms, ratio tp2/tp1 {two['step_s'] / one['step_s']:.3f}")


if __name__ == "__main__":
    main()
