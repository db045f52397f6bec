"""A study's finished runs kept in the checkout (issue #29), so that a study longer than one machine's
lease (the long CPU comparison: hours on 2 cores) goes on where the last machine stopped.

A run's record is what the reports read, config.yaml and metrics.jsonl (rgpt_dist.eval.grid), plus
record.json (the run's wall time over its launches, the date, the dataset's fingerprint); never a
checkpoint. A record
stands for a run only when it is finished, was trained on the same dataset and its config equals the
one the study would train now up to the machine's own paths; otherwise the run is trained again and
the launcher says why. No torch import.

Records come from other machines and merges: every record file is read, checked and written through
rgpt_dist.studies.record_files (one reader, one schema, one writer that refuses links; docs/security.md).
A record that cannot be read is refused, not trained over: `pending` names every such record and the
study stops (exit status 2) before anything is restored or trained.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from rgpt_dist.durable import UnsafePath, open_regular
from rgpt_dist.config.experiment import load_config
from rgpt_dist.eval.grid import FINISHED, summarize_run
from rgpt_dist.studies.record_files import (MAX_RECORD_JSON_BYTES, MAX_RUN_FILE_BYTES, MAX_SECONDS, RECORD_JSON,  # noqa: F401
                                             RecordError, RecordMeta, _Dir, _entry_problem, _integer, _number,
                                             _path_problems, _read_in, plain_name, read_bytes, read_record)

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
    directory gets one); RecordError when LAUNCHES is a link, a FIFO or not a regular file."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    try:
        fd = open_regular(Path(run_dir) / LAUNCHES, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except UnsafePath as e:
        raise RecordError(str(e)) from None
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(json.dumps({"wall_s": round(wall_s, 1), "returncode": returncode}) + "\n")


def _jsonl_rows(path: Path) -> list[Any]:
    """The parsed lines of a JSONL file of the run (read_bytes); lines that are not JSON are left out."""
    rows = []
    for line in read_bytes(path, MAX_RUN_FILE_BYTES).decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except (ValueError, RecursionError):  # a torn last line; nesting or a number beyond the parser
            continue
    return rows


def train_seconds(metrics: str | Path) -> float:
    """Seconds spent in training steps, from metrics.jsonl's logged throughput (each logged window's
    tokens over its tokens/s): every step counted once, even one of a launch that the LAUNCHES tally
    missed (killed with the launcher); it leaves out start-up, evaluation and checkpoints. Rows that
    are not records with an integer token count and a positive finite throughput add nothing."""
    seconds, tokens = 0.0, 0
    for row in _jsonl_rows(Path(metrics)):
        if isinstance(row, dict) and _number(row.get("tokens_per_s"), 1e-9, math.inf) \
                and _integer(row.get("tokens"), 0, 10 ** 18):
            seconds += (row["tokens"] - tokens) / row["tokens_per_s"]
            tokens = row["tokens"]
    return seconds


def save(run_dir: str | Path, record_dir: str | Path, *, data_dir: str | Path | None,
         files: tuple[str, ...] = RECORD_FILES) -> Path:
    """Copies a finished run's `files` (paths inside the run directory: config.yaml, metrics.jsonl and
    what its report reads) into record_dir (each file atomically, record.json last: a record without
    it is incomplete and ignored) with the summed wall time of its launches (LAUNCHES; a launch killed
    with the launcher itself is not in it), its time in training steps (train_seconds) and the
    dataset's fingerprint (None for generated tasks), and returns record_dir. RecordError, before
    anything is written, for a file name that is not a plain relative path, a file missing, or a link
    or FIFO on the way (in the run directory or the record directory)."""
    run_dir, record_dir = Path(run_dir), Path(record_dir)
    for name in files:
        plain_name(name, f"{run_dir}: record file", nested=True)
    plain_name(run_dir.name, f"{run_dir}: run name")
    tally = run_dir / LAUNCHES
    launches = [] if not os.path.lexists(tally) else [
        x for x in _jsonl_rows(tally) if isinstance(x, dict) and _number(x.get("wall_s"), 0.0, MAX_SECONDS)]
    contents = {name: _read_in(run_dir, name, MAX_RUN_FILE_BYTES) for name in files}
    meta = {"run": run_dir.name, "wall_s": round(sum(x["wall_s"] for x in launches), 1), "launches": len(launches),
            "train_s": round(train_seconds(run_dir / "metrics.jsonl"), 1),
            "data_sha256": None if data_dir is None else fingerprint(data_dir),
            "finished_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "cpus": os.cpu_count()}
    RecordMeta.from_dict(meta, record_dir / RECORD_JSON)  # never write a record that would be refused
    problems = [p for name in (*files, RECORD_JSON) for p in _path_problems(record_dir, name, "record")]
    if problem := _entry_problem(record_dir, True, "record"):
        problems.insert(0, problem)
    if problems:
        raise RecordError("; ".join(problems))
    with _Dir.open(record_dir, "record") as top:
        for name, data in contents.items():
            *dirs, leaf = name.split("/")
            opened = [top]
            try:
                for d in dirs:
                    opened.append(opened[-1].sub(d))
                opened[-1].write(leaf, data)
            finally:
                for d in opened[1:]:
                    d.close()
        top.write(RECORD_JSON, (json.dumps(meta, indent=1) + "\n").encode())
    return record_dir


def _comparable(cfg) -> dict[str, Any]:
    d = cfg.to_dict()
    for section, key in MACHINE_FIELDS:
        d[section].pop(key, None)
    return d


def why_not(record_dir: str | Path, expected_cfg, data_dir: str | Path) -> str | None:
    """None when the record stands for the run the study would train now (expected_cfg, a loaded
    Config, on data_dir), else the reason it does not ("no record" when there is none). RecordError
    when the record cannot be read: record.json not a record (read_record), the record directory or
    one of its files a link, a FIFO, too large or missing, its config.yaml not a config."""
    record_dir = Path(record_dir)
    if problem := _entry_problem(record_dir, True, "read a record"):
        raise RecordError(problem)
    try:
        meta = read_record(record_dir / RECORD_JSON)
    except FileNotFoundError:
        return "no record"
    for name in RECORD_FILES:  # regular files of bounded size, before a parser opens them
        _read_in(record_dir, name, MAX_RUN_FILE_BYTES, verb="read a record")
    try:
        cfg = load_config(record_dir / "config.yaml")
    except Exception as e:  # ConfigError, YAML errors: one line naming the file
        raise RecordError(f"{record_dir / 'config.yaml'}: not a config ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:300]})") from None
    if meta.data_sha256 != fingerprint(data_dir):
        return f"{record_dir}: trained on another dataset (manifest sha256 {str(meta.data_sha256)[:12]})"
    if _comparable(cfg) != _comparable(expected_cfg):
        return f"{record_dir}: its config.yaml differs from the run's config now"
    row = summarize_run(record_dir, stale_after_s=None)
    if row["status"] != FINISHED:
        return f"{record_dir}: not finished ({row['progress']}{'; ' + row['problem'] if row['problem'] else ''})"
    return None


RESTORED = (*RECORD_FILES, RECORD_JSON)


def restore_problems(run_dir: str | Path) -> list[str]:
    """Why a record cannot be restored into run_dir now: the directory or one of the RESTORED names
    in it a symbolic link, a FIFO or of the wrong kind (one message each, naming it)."""
    run_dir = Path(run_dir)
    if problem := _entry_problem(run_dir, True, "restore"):
        return [problem]
    return [p for name in RESTORED if (p := _entry_problem(run_dir / name, False, "restore"))]


def restore(record_dir: str | Path, run_dir: str | Path) -> None:
    """Puts a record's files into run_dir (replacing an unfinished run's config.yaml and
    metrics.jsonl there), where the reports read them. Each file is read with read_bytes and written
    by the link-refusing writer; RecordError, before anything is written, when run_dir or an entry
    being written is a symbolic link, a FIFO or of the wrong kind, or the record cannot be read."""
    record_dir, run_dir = Path(record_dir), Path(run_dir)
    plain_name(run_dir.name, f"{run_dir}: run name")
    if problem := _entry_problem(record_dir, True, "read a record"):
        raise RecordError(problem)
    contents = {name: _read_in(record_dir, name, MAX_RECORD_JSON_BYTES if name == RECORD_JSON else MAX_RUN_FILE_BYTES,
                               verb="read a record") for name in RESTORED}
    if problems := restore_problems(run_dir):
        raise RecordError("; ".join(problems))
    with _Dir.open(run_dir, "restore") as d:
        for name, data in contents.items():
            d.write(name, data)


def wall_seconds(record_dirs: list[Path], key: str = "wall_s") -> float:
    """The summed wall time (or `key`: train_s, the time in training steps) of the records that
    have one: a study's time across machines. A record that cannot be read (read_record) is left out
    and said so on stderr."""
    if key not in ("wall_s", "train_s"):
        raise ValueError(f"wall_seconds: key {key!r} is not wall_s or train_s")
    total = 0.0
    for d in map(Path, record_dirs):
        try:
            if problem := _entry_problem(d, True, "read a record"):
                raise RecordError(problem)
            total += getattr(read_record(d / RECORD_JSON), key)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except RecordError as e:
            print(f"{e}: left out of the summed time", file=sys.stderr, flush=True)
    return total


def pending(runs: list, configs: dict[str, Any], record_root: str | Path, out_dir: str | Path,
            data_dir: str | Path) -> list:
    """The runs a study still has to train: a run whose record under record_root stands for it
    (why_not; configs: run name -> the Config it would train with) is restored into out_dir and
    left out, each decision printed. RecordError, before anything is restored, naming every record
    that cannot be read and every output entry a restore would have to write through."""
    decisions, problems = [], []
    for run in runs:
        try:
            plain_name(run.name, "run name")
            reason = why_not(Path(record_root) / run.name, configs[run.name], data_dir)
        except RecordError as e:
            problems.append(str(e))
            continue
        if reason is None:
            problems += restore_problems(Path(out_dir) / run.name)
        decisions.append((run, reason))
    if problems:
        raise RecordError(f"{len(problems)} problem{'s' * (len(problems) > 1)} with the records in {record_root} "
                          f"or the output directory {out_dir}; nothing restored or trained:\n  " + "\n  ".join(problems)
                          + "\n(fix or remove each record named: it is made again when its run is trained; "
                          "remove what is planted in the output directory)")
    todo = []
    for run, reason in decisions:
        if reason is None:
            restore(Path(record_root) / run.name, Path(out_dir) / run.name)
            print(f"{run.name}: recorded in {record_root}, not trained again", flush=True)
        else:
            todo.append(run)
            if reason != "no record":
                print(f"{run.name}: trained again: {reason}", flush=True)
    return todo
