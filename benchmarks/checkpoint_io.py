"""Checkpoint save and load throughput against model size, and the universal conversion's cost.

    .venv/bin/python benchmarks/checkpoint_io.py             # GPT-2 small and medium, fp32, ZeRO-1: ~3 min on 2 cores
    .venv/bin/python benchmarks/checkpoint_io.py --quick     # a tiny model (the smoke test's)
    .venv/bin/python benchmarks/checkpoint_io.py --sabotage  # every file hashed 8 times: the bar must fail

One process (gloo, world size 1) builds the engine the trainer builds (fp32, ZeRO-1, torch AdamW
with its moments filled by one step) and, per model:
1. save: CheckpointManager.save, the trainer's whole path (DeepSpeed's files, the RNG file, fsync,
   sha256 of every file, the record, `latest`), in MB/s of checkpoint written;
2. load: newest_valid (verify every sha256, scan every file for pickled code) and load, in MB/s;
3. the work neither can avoid, measured in the same run on the same bytes: plain file I/O (written
   with fsync, read back) plus one sha256 pass (the completion record, the verification);
4. convert: the universal conversion rgpt_dist/parallel/universal.py runs when a checkpoint resumes
   at another layout, in seconds and as a multiple of the save.
Bar (printed, exit 1 when missed): save and load each take at most 2x that unavoidable work (ratio
>= 0.5; DeepSpeed's serialisation, the pickle scan and the fsyncs are the rest). Against plain I/O
alone a load cannot come close: the page cache is warm for reads (a just-written checkpoint, as a
resume after a preemption sees it), so reading runs at memory speed while sha256 runs at ~1.5 GB/s
per core.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

BAR = 0.5
MODELS = {"small": ["model=gpt2-small"], "medium": ["model=gpt2-medium"]}
QUICK = {"tiny": ["model=gpt2-small", "model.n_layer=2", "model.d_model=64", "model.n_head=2"]}


def _single_process_env() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        os.environ.setdefault(key, value)


def engine_for(overrides: list[str]):
    """(engine, config) as the trainer builds them, with Adam's moments filled by one step."""
    import torch

    from rgpt_dist.config import load_config
    from rgpt_dist.parallel.dims import ParallelDims
    from rgpt_dist.parallel.zero import init_engine
    from rgpt_dist.registry import build_model
    from rgpt_dist.train.optim import make_optimizer, make_scheduler

    cfg = load_config("configs/experiments/gpt2-small-20k.yaml", [
        *overrides, "parallel.dtype=fp32", "parallel.zero_stage=1", "parallel.compile=none",
        "train.micro_batch_size=1", "train.global_batch_size=1", "train.seq_len=16"])
    model = build_model(cfg.model, seed=0)
    optimizer = make_optimizer(model, cfg.train)
    engine = init_engine(model, optimizer, make_scheduler(optimizer, cfg.train), cfg, ParallelDims.from_env(1))
    x = torch.randint(0, cfg.model.vocab_size, (1, 17))
    engine.backward(engine(x[:, :-1], x[:, 1:]).loss)
    engine.step()
    return engine, cfg


def plain_io(directory: Path, nbytes: int) -> tuple[float, float]:
    """Seconds to write `nbytes` (with fsync) and to read them back, in 64 MiB blocks."""
    block = os.urandom(64 << 20)
    path = directory / "plain.bin"
    t = time.perf_counter()
    with open(path, "wb") as f:
        for offset in range(0, nbytes, len(block)):
            f.write(block[:min(len(block), nbytes - offset)])
        f.flush()
        os.fsync(f.fileno())
    written = time.perf_counter() - t
    t = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    read = time.perf_counter() - t
    path.unlink()
    return written, read


def measure(name: str, overrides: list[str], root: Path, sabotage: bool) -> dict:
    from rgpt_dist.parallel.reshard import layout_for
    from rgpt_dist.parallel.universal import KEY as UNIVERSAL, convert, universal_info
    from rgpt_dist.checkpoints import record as checkpoint  # its _sha256: what a save and a load hash with
    from rgpt_dist.train.checkpoint import CheckpointManager

    engine, cfg = engine_for(overrides)
    params = sum(p.numel() for p in engine.module.parameters())
    ckpt = CheckpointManager(root / name, keep_last=1, rank=0)
    state = {"step": 1, "tokens": 0, "loader": {}, "config": cfg.to_dict(),  # as Trainer.client_state()
             UNIVERSAL: universal_info(engine.module, layout_for(cfg.model))}
    if sabotage:  # the deliberately slowed path: every checksum computed 8 times
        honest = checkpoint._sha256
        checkpoint._sha256 = lambda p: [honest(p) for _ in range(8)][0]
    t = time.perf_counter()
    tag_dir = ckpt.save(engine, 1, state)
    save_s = time.perf_counter() - t
    nbytes = sum(p.stat().st_size for p in tag_dir.rglob("*") if p.is_file())
    t = time.perf_counter()
    tag = ckpt.newest_valid()
    ckpt.load(engine, tag)
    load_s = time.perf_counter() - t
    if sabotage:
        checkpoint._sha256 = honest
    t = time.perf_counter()
    convert(tag_dir, root / name / "universal" / tag)
    convert_s = time.perf_counter() - t
    t = time.perf_counter()
    for f in tag_dir.rglob("*"):
        if f.is_file():
            checkpoint._sha256(f)
    hash_s = time.perf_counter() - t
    write_s, read_s = plain_io(root, nbytes)
    shutil.rmtree(root / name)
    mb = nbytes / 1e6
    return {"model": name, "params": params, "mb": mb, "save_s": save_s, "load_s": load_s, "write_s": write_s,
            "read_s": read_s, "hash_s": hash_s, "convert_s": convert_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model only (the smoke test's)")
    parser.add_argument("--sabotage", action="store_true", help="hash every file 8 times: shows the bar failing")
    parser.add_argument("--model", choices=list(MODELS), action="append", help="only these models (repeatable)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args(argv)
    models = QUICK if args.quick else {m: MODELS[m] for m in (args.model or MODELS)}
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _single_process_env()
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for name, overrides in models.items():
            rows.append(measure(name, overrides, Path(tmp), args.sabotage))
    dist.destroy_process_group()
    print("| model | parameters | checkpoint MB | save MB/s | load MB/s | plain write MB/s | plain read MB/s | "
          "sha256 MB/s | save ratio | load ratio | universal conversion s (x save) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for r in rows:
        mb = r["mb"]
        save_ratio = (r["write_s"] + r["hash_s"]) / r["save_s"]
        load_ratio = (r["read_s"] + r["hash_s"]) / r["load_s"]
        ok &= save_ratio >= BAR and load_ratio >= BAR
        print(f"| {r['model']} | {r['params']:,} | {mb:,.0f} | {mb / r['save_s']:,.0f} | {mb / r['load_s']:,.0f} | "
              f"{mb / r['write_s']:,.0f} | {mb / r['read_s']:,.0f} | {mb / r['hash_s']:,.0f} | {save_ratio:.2f} | "
              f"{load_ratio:.2f} | {r['convert_s']:.1f} ({r['convert_s'] / r['save_s']:.1f}x) |")
    print(f"bar: save and load >= {BAR}x (plain I/O + one sha256 pass): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
