"""Where metrics go: console, RUN_DIR/metrics.jsonl and wandb, written by rank 0 only.

wandb runs online only with an API key and WANDB_MODE unset (or log.wandb=online); otherwise offline,
into RUN_DIR/wandb, with no network calls. `log.wandb=disabled` turns it off.

metrics.jsonl survives being killed at any point: each record is one appended line, flushed and
fsynced; a process killed mid-append leaves at most a torn last line, which `read_metrics` drops
with a warning (as it drops a corrupt line anywhere), and every rewrite (the resume cut, the run id)
is an atomic, durable replacement (rgpt_dist.durable).
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from rgpt_dist.config.experiment import Config
from rgpt_dist.durable import atomic_write_text, fsync_dir, open_regular
from rgpt_dist.flops import recompute_flops, train_flops
from rgpt_dist.progress import bar
import uuid

# Dense bf16 tensor-core peaks (FLOP/s) by device-name substring, for MFU on GPUs.
GPU_PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


def step_flops(cfg: Config, widths: list[int], depths: list[int | None]) -> tuple[float, float, int]:
    """(model FLOPs, hardware FLOPs, tokens) of one optimizer step: the global batch in equal parts of
    the padded widths `widths` (one part of train.seq_len, or a task loader's length buckets, part
    j = micro * dp + rank), at the depths the micro-batches ran (one, or one per micro-batch: paired
    with the parts when they split alike, else averaged): Eq. 1 training FLOPs, and those plus the
    forward recomputed by activation checkpointing."""
    rows, n = cfg.train.global_batch_size // len(widths), len(depths)
    parts = [(S, [depths[j * n // len(widths)]] if len(widths) % n == 0 else depths) for j, S in enumerate(widths)]
    model = hardware = 0.0
    for S, rs in parts:
        tokens = rows * S
        flops = sum(train_flops(cfg.model, S, d) for d in rs) / len(rs) * tokens
        recompute = sum(recompute_flops(cfg.model, S, d, cfg.parallel.activation_checkpointing) for d in rs)
        model, hardware = model + flops, hardware + flops + recompute / len(rs) * tokens
    return model, hardware, rows * sum(widths)


def peak_flops(dtype: str) -> tuple[float, str]:
    """(FLOP/s, source): the datasheet bf16 peak of a known GPU, else an fp32 matmul timed here.
    dtype: parallel.dtype; bf16 and bf16-autocast (whose matmuls run in bf16) get the bf16 peak,
    fp32 half of it (TF32 tensor cores)."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for key, peak in GPU_PEAK_BF16.items():
            if key in name:
                return (peak if dtype in ("bf16", "bf16-autocast") else peak / 2), f"{name} datasheet"
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


_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a subset of what wandb accepts as a run id


def _wandb_run_id(run_dir: Path) -> str:
    """One wandb run per run directory: a resumed or requeued job continues the same wandb run. An
    unreadable id file (emptied, binary) starts a new wandb run with a warning rather than failing."""
    path = run_dir / "wandb_run_id"
    if os.path.lexists(path):  # a link or a FIFO here raises UnsafePath, never followed
        with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:
            text = f.read(256).decode("utf-8", errors="replace").strip()
        if _RUN_ID.fullmatch(text):
            return text
        warnings.warn(f"{path} does not hold a wandb run id ({text[:40]!r}): starting a new wandb run", stacklevel=2)

    run_id = uuid.uuid4().hex[:16]
    atomic_write_text(path, run_id)
    return run_id


MAX_WARNINGS = 5
"""Dropped lines warned about one by one; the rest are counted in one more warning."""


def _record(raw: bytes) -> dict[str, Any] | None:
    """The record a metrics line holds, or None when it is not one (torn, corrupt, not a mapping
    with an integer step)."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    if not isinstance(record, dict) or type(record.get("step")) is not int:
        return None
    return record


def read_metrics(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) for every intact record of a metrics.jsonl, in file order.

    Never raises on content: an unterminated last line that does not parse is a write cut short by
    a kill (torn) and any other unparseable line is corrupt; both are dropped with a warning naming
    path:line. A missing file has no records; a link or a FIFO at `path` raises UnsafePath (it is
    not followed: its records would be another file's, and a FIFO would block)."""
    path = Path(path)
    if not os.path.lexists(path):
        return []
    with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    out, dropped = [], []
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        record = _record(raw)
        if record is None:
            torn = lineno == len(lines)  # no newline after it: the append did not finish
            dropped.append(f"{path}:{lineno}: " + ("torn last line (the writer was killed mid-write)" if torn
                                                   else "corrupt record") + ": dropped")
            continue
        out.append((raw.decode("utf-8").rstrip("\r"), record))
    for message in dropped[:MAX_WARNINGS]:
        warnings.warn(message, stacklevel=2)
    if len(dropped) > MAX_WARNINGS:
        warnings.warn(f"{path}: {len(dropped) - MAX_WARNINGS} more unreadable lines dropped", stacklevel=2)
    return out


def _finite(value: Any) -> Any:
    """JSON has no NaN or Infinity: non-finite floats (also inside lists) are written as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class MetricsSink:
    """Console + JSONL + wandb on rank 0; a no-op elsewhere. `resume_at(step)` drops JSONL records of
    steps after a resumed checkpoint, so every step appears once. Records carry `step` = optimizer
    steps completed. A torn last line left by a killed predecessor is cut off on start, so that the
    first new record does not land on the end of it."""

    def __init__(self, cfg: Config, is_main: bool):
        self.is_main = is_main
        self.path = Path(cfg.log.run_dir) / "metrics.jsonl"
        self.wandb, self.bar = None, None
        if not is_main:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(self.path) and not self._ends_with_newline():
            self._rewrite(lambda record: True)
        mode = _wandb_mode(cfg.log.wandb)
        if mode != "disabled":
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb  # wandb only when a run logs to it
            self.wandb = wandb.init(project=cfg.log.project, name=cfg.log.name or Path(cfg.log.run_dir).name,
                                    dir=cfg.log.run_dir, mode=mode, config=cfg.to_dict(), resume="allow",
                                    id=_wandb_run_id(Path(cfg.log.run_dir)))

    def _ends_with_newline(self) -> bool:
        with os.fdopen(open_regular(self.path, os.O_RDONLY), "rb") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return True
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def _rewrite(self, keep) -> None:
        """Replace metrics.jsonl by its intact records for which keep(record) holds (atomically)."""
        kept = [line for line, record in read_metrics(self.path) if keep(record)]
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def resume_at(self, step: int) -> None:
        """Keep the records of steps <= step (a checkpoint taken after `step` completed steps)."""
        if not self.is_main or not os.path.lexists(self.path):
            return
        self._rewrite(lambda record: record["step"] <= step)

    def log(self, record: dict[str, Any], console: str | None = None) -> None:
        if not self.is_main:
            return
        clean = {k: _finite(v) for k, v in record.items()}
        created = not os.path.lexists(self.path)
        # One write of one whole line, then fsync: a kill can tear only this line, and a record on
        # disk stays there (resume cuts the file back to the checkpoint's step, never below it).
        # No-follow: a link planted at metrics.jsonl mid-run is refused, not appended through.
        with os.fdopen(open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a") as f:
            f.write(json.dumps(clean) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if created:
            fsync_dir(self.path.parent)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in clean.items() if isinstance(v, (int, float)) and v is not None},
                           step=record["step"])
        if console:
            if self.bar is not None and not self.bar.disable:
                self.bar.write(console, file=sys.stdout)  # above the bar, which is redrawn below it
            else:
                print(console, flush=True)

    def start_progress(self, done: int, total: int) -> None:
        """A progress bar over the optimizer steps on rank 0 (rgpt_dist.progress: a terminal only)."""
        if self.is_main:
            self.bar = bar(total=total, desc="steps", unit="step")
            self.bar.update(done)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.wandb is not None:
            self.wandb.finish()
