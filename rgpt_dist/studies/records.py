"""A study's finished runs kept in the checkout (issue #29), so that a study longer than one machine's
lease (the long CPU comparison: hours on 2 cores) goes on where the last machine stopped.

A run's record is what the reports read, config.yaml and metrics.jsonl (rgpt_dist.eval.grid), plus
record.json (the run's wall time over its launches, the date, the dataset's fingerprint); never a
checkpoint. A record
stands for a run only when it is finished, was trained on the same dataset and its config equals the
one the study would train now up to the machine's own paths; otherwise the run is trained again and
the launcher says why. No torch import.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from rgpt_dist.durable import atomic_write_bytes, atomic_write_text
from rgpt_dist.config.experiment import load_config
from rgpt_dist.eval.grid import FINISHED, summarize_run

RECORD_FILES = ("config.yaml", "metrics.jsonl")
MACHINE_FIELDS = (("data", "paths"), ("log", "run_dir"), ("checkpoint", "dir"))
"""Config fields that name the machine's own paths: a record made elsewhere differs only there."""


def fingerprint(data_dir: str | Path) -> str:
    """sha256 of the dataset's manifest.json (rgpt-prep records every shard's hash in it)."""
    return hashlib.sha256((Path(data_dir) / "manifest.json").read_bytes()).hexdigest()


LAUNCHES = "launches.jsonl"
"""In a run directory: one line per launch of the run that the launcher saw end (wall time, exit
status), so that a run resumed after a failure is recorded with all the time it took."""


def launch_ended(run_dir: str | Path, wall_s: float, returncode: int) -> None:
    """Appends one launch of the run to its LAUNCHES tally (a run refused before it made its
    directory gets one)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / LAUNCHES, "a", encoding="utf-8") as f:
        f.write(json.dumps({"wall_s": round(wall_s, 1), "returncode": returncode}) + "\n")


def train_seconds(metrics: str | Path) -> float:
    """Seconds spent in training steps, from metrics.jsonl's logged throughput (each logged window's
    tokens over its tokens/s): every step counted once, even one of a launch that the LAUNCHES tally
    missed (killed with the launcher); it leaves out start-up, evaluation and checkpoints."""
    seconds, tokens = 0.0, 0
    for line in Path(metrics).read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if row.get("tokens_per_s"):
            seconds += (row["tokens"] - tokens) / row["tokens_per_s"]
            tokens = row["tokens"]
    return seconds


def save(run_dir: str | Path, record_dir: str | Path, *, data_dir: str | Path | None,
         files: tuple[str, ...] = RECORD_FILES) -> Path:
    """Copies a finished run's `files` (paths inside the run directory: config.yaml, metrics.jsonl and
    what its report reads) into record_dir (each file atomically, record.json last: a record without
    it is incomplete and ignored) with the summed wall time of its launches (LAUNCHES; a launch killed
    with the launcher itself is not in it), its time in training steps (train_seconds) and the
    dataset's fingerprint (None for generated tasks), and returns record_dir."""
    run_dir, record_dir = Path(run_dir), Path(record_dir)
    tally = run_dir / LAUNCHES
    launches = [json.loads(line) for line in tally.read_text().splitlines() if line.strip()] if tally.is_file() else []
    for name in files:
        (record_dir / name).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(record_dir / name, (run_dir / name).read_bytes())
    meta = {"run": run_dir.name, "wall_s": round(sum(x["wall_s"] for x in launches), 1), "launches": len(launches),
            "train_s": round(train_seconds(run_dir / "metrics.jsonl"), 1),
            "data_sha256": None if data_dir is None else fingerprint(data_dir),
            "finished_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "cpus": os.cpu_count()}
    atomic_write_text(record_dir / "record.json", json.dumps(meta, indent=1) + "\n")
    return record_dir


def _comparable(cfg) -> dict[str, Any]:
    d = cfg.to_dict()
    for section, key in MACHINE_FIELDS:
        d[section].pop(key, None)
    return d


def why_not(record_dir: str | Path, expected_cfg, data_dir: str | Path) -> str | None:
    """None when the record stands for the run the study would train now (expected_cfg, a loaded
    Config, on data_dir), else the reason it does not."""

    record_dir = Path(record_dir)
    if not (record_dir / "record.json").is_file():
        return "no record"
    meta = json.loads((record_dir / "record.json").read_text())
    if meta.get("data_sha256") != fingerprint(data_dir):
        return f"{record_dir}: trained on another dataset (manifest sha256 {str(meta.get('data_sha256'))[:12]})"
    if _comparable(load_config(record_dir / "config.yaml")) != _comparable(expected_cfg):
        return f"{record_dir}: its config.yaml differs from the run's config now"
    row = summarize_run(record_dir, stale_after_s=None)
    if row["status"] != FINISHED:
        return f"{record_dir}: not finished ({row['progress']}{'; ' + row['problem'] if row['problem'] else ''})"
    return None


def restore(record_dir: str | Path, run_dir: str | Path) -> None:
    """Puts a record's files into run_dir (replacing an unfinished run's config.yaml and
    metrics.jsonl there), where the reports read them."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in (*RECORD_FILES, "record.json"):
        shutil.copyfile(Path(record_dir) / name, run_dir / name)


def wall_seconds(record_dirs: list[Path], key: str = "wall_s") -> float:
    """The summed wall time (or `key`: train_s, the time in training steps) of the records that
    have one: a study's time across machines."""
    metas = [json.loads((d / "record.json").read_text()) for d in record_dirs if (d / "record.json").is_file()]
    return sum(m.get(key, 0.0) for m in metas)


def pending(runs: list, configs: dict[str, Any], record_root: str | Path, out_dir: str | Path,
            data_dir: str | Path) -> list:
    """The runs a study still has to train: a run whose record under record_root stands for it
    (why_not; configs: run name -> the Config it would train with) is restored into out_dir and
    left out, each decision printed."""
    todo = []
    for run in runs:
        reason = why_not(Path(record_root) / run.name, configs[run.name], data_dir)
        if reason is None:
            restore(Path(record_root) / run.name, Path(out_dir) / run.name)
            print(f"{run.name}: recorded in {record_root}, not trained again", flush=True)
        else:
            todo.append(run)
            if reason != "no record":
                print(f"{run.name}: trained again: {reason}", flush=True)
    return todo
