"""Where metrics go: console, RUN_DIR/metrics.jsonl and wandb, written by rank 0 only.

wandb runs online only with an API key and WANDB_MODE unset (or log.wandb=online); otherwise offline,
into RUN_DIR/wandb, with no network calls. `log.wandb=disabled` turns it off.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from rgpt_dist.config.experiment import Config

# Dense bf16 tensor-core peaks (FLOP/s) by device-name substring, for MFU on GPUs.
GPU_PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


def peak_flops(dtype: str) -> tuple[float, str]:
    """(FLOP/s, source): the datasheet bf16 peak of a known GPU, else an fp32 matmul timed here."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for key, peak in GPU_PEAK_BF16.items():
            if key in name:
                return (peak if dtype == "bf16" else peak / 2), f"{name} datasheet"
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(6):  # best of several: the peak, not an average disturbed by start-up work
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best, f"measured fp32 {n}^3 matmul, {torch.get_num_threads()} threads"


def _wandb_mode(setting: str) -> str:
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if setting == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return setting


def _wandb_run_id(run_dir: Path) -> str:
    """One wandb run per run directory: a resumed or requeued job continues the same wandb run."""
    path = run_dir / "wandb_run_id"
    if not path.exists():
        import uuid

        tmp = path.with_suffix(".tmp")
        tmp.write_text(uuid.uuid4().hex[:16])
        os.replace(tmp, path)
    return path.read_text().strip()


class MetricsSink:
    """Console + JSONL + wandb on rank 0; a no-op elsewhere. `resume_at(step)` drops JSONL records of
    steps after a resumed checkpoint, so every step appears once. Records carry `step` = optimizer
    steps completed."""

    def __init__(self, cfg: Config, is_main: bool):
        self.is_main = is_main
        self.path = Path(cfg.log.run_dir) / "metrics.jsonl"
        self.wandb = None
        if not is_main:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mode = _wandb_mode(cfg.log.wandb)
        if mode != "disabled":
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb
            self.wandb = wandb.init(project=cfg.log.project, name=cfg.log.name or Path(cfg.log.run_dir).name,
                                    dir=cfg.log.run_dir, mode=mode, config=cfg.to_dict(), resume="allow",
                                    id=_wandb_run_id(Path(cfg.log.run_dir)))

    def resume_at(self, step: int) -> None:
        """Keep the records of steps <= step (a checkpoint taken after `step` completed steps)."""
        if not self.is_main or not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if json.loads(line)["step"] <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def log(self, record: dict[str, Any], console: str | None = None) -> None:
        if not self.is_main:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in clean.items() if isinstance(v, (int, float)) and v is not None},
                           step=record["step"])
        if console:
            print(console, flush=True)

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
