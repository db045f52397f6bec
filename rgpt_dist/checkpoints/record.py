"""The completion record of a checkpoint (DIR/step_NNNNNNNN/checksums.json: the sha256 of every
file, written last by rank 0: rgpt_dist.train.checkpoint) and the check that a checkpoint is
complete and intact, for everything that reads checkpoints (training's resume, consolidation,
evaluation)."""
from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

TAG_PREFIX = "step_"
RECORD = "checksums.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _entries(tag_dir: Path) -> tuple[dict[str, Path], list[str]]:
    """(relative name -> path of every regular file except the record, names of anything else:
    links, devices, FIFOs). Links are never followed: a checkpoint cannot point outside itself."""
    files, odd = {}, []
    for p in sorted(tag_dir.rglob("*")):
        mode = p.lstat().st_mode
        name = p.relative_to(tag_dir).as_posix()
        if stat.S_ISREG(mode):
            if name != RECORD:
                files[name] = p
        elif not stat.S_ISDIR(mode):
            odd.append(name)
    return files, odd


def checksums(tag_dir: Path) -> dict[str, str]:
    return {name: _sha256(p) for name, p in _entries(tag_dir)[0].items()}


def _read_record(record: Path) -> dict[str, str] | None:
    try:
        expected = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nesting deeper than json's parser goes
        return None
    ok = isinstance(expected, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in expected.items())
    return expected if ok else None


def verify(tag_dir: Path) -> str | None:
    """None when the checkpoint is complete and intact, else why not. Complete means: the record
    lists every file in the directory, each listed file exists and matches its sha256, and the
    directory holds nothing but regular files (an empty or partial record does not verify)."""
    record = tag_dir / RECORD
    if not record.is_file() or record.is_symlink():
        return f"incomplete (no {RECORD}: the writer did not finish)"
    expected = _read_record(record)
    if expected is None:
        return f"corrupted ({RECORD} is not a JSON object of file name -> sha256)"
    files, odd = _entries(tag_dir)
    if odd:
        return f"corrupted ({', '.join(odd[:3])}: not a regular file)"
    problems = [f"{k} missing" for k in sorted(set(expected) - set(files))]
    problems += [f"{k} not listed" for k in sorted(set(files) - set(expected))]
    if not expected:
        problems.append(f"{RECORD} lists no files")
    if not problems:
        problems = [f"{k} fails the checksum" for k in sorted(files) if _sha256(files[k]) != expected[k]]
    return f"corrupted ({', '.join(problems[:3])}{' ...' if len(problems) > 3 else ''})" if problems else None
