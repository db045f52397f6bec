"""Checks that need the world size or the filesystem, run on every rank before any heavy
initialisation (the config itself was validated by Config.validate)."""
from __future__ import annotations

import json
from pathlib import Path

from rgpt_dist.config.experiment import Config


def preflight(cfg: Config, world_size: int) -> list[str]:
    """Problems that would only surface after minutes of start-up, each naming the values involved."""
    out = []
    t, p = cfg.train, cfg.parallel
    if world_size % p.tp_size:
        out.append(f"world size {world_size} is not divisible by parallel.tp_size={p.tp_size}")
        return out
    dp = world_size // p.tp_size
    if t.global_batch_size % (t.micro_batch_size * dp):
        out.append(f"train.global_batch_size={t.global_batch_size} is not divisible by train.micro_batch_size="
                   f"{t.micro_batch_size} x {dp} data-parallel ranks")
    splits = [cfg.data.train_split] + ([cfg.data.val_split] if cfg.eval.every_steps > 0 else [])
    for i, root in enumerate(cfg.data.paths):
        if "://" in root:
            continue
        for split in splits:
            if not (Path(root) / split / "index.json").is_file():
                out.append(f"data.paths[{i}]={root!r} has no {split}/index.json (prepare it with rgpt-prep)")
        manifest = Path(root) / "manifest.json"
        if manifest.is_file():
            seq = json.loads(manifest.read_text()).get("seq_len")
            if seq != t.seq_len:
                out.append(f"data.paths[{i}]={root!r} holds samples of seq_len {seq}, but train.seq_len={t.seq_len}")
    run_dir = Path(cfg.log.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        out.append(f"log.run_dir={cfg.log.run_dir!r} exists and is not a directory")
    if cfg.checkpoint.dir and Path(cfg.checkpoint.dir).is_file():
        out.append(f"checkpoint.dir={cfg.checkpoint.dir!r} is a file")
    return out
