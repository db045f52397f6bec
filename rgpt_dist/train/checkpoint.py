"""Checkpoints that are complete or invisible.

A checkpoint is the directory DIR/step_NNNNNNNN written by DeepSpeed (model, optimizer, scheduler,
client state: step, tokens, loader state, resolved config) plus one RNG file per rank. It becomes
visible only after every rank has finished writing: rank 0 then records a sha256 of every file in
`checksums.json` and points DIR/latest at it, each written atomically (temp file + rename). On start
the newest checkpoint whose checksums verify is loaded; incomplete or corrupted ones are skipped with
a warning. Only the last `keep_last` complete checkpoints are kept.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

TAG_PREFIX = "step_"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _checksums(tag_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(tag_dir)): _sha256(p) for p in sorted(tag_dir.rglob("*"))
            if p.is_file() and p.name != "checksums.json"}


def verify(tag_dir: Path) -> str | None:
    """None when the checkpoint is complete and intact, else why not."""
    record = tag_dir / "checksums.json"
    if not record.exists():
        return "incomplete (no checksums.json: the writer did not finish)"
    expected = json.loads(record.read_text())
    actual = _checksums(tag_dir)
    bad = sorted(k for k in expected if actual.get(k) != expected[k])
    return f"corrupted ({', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} fail the checksum)" if bad else None


class CheckpointManager:
    def __init__(self, directory: str | Path, keep_last: int, rank: int):
        self.dir, self.keep_last, self.rank = Path(directory), keep_last, rank

    def tags(self) -> list[Path]:
        """Checkpoint directories, newest first."""
        if not self.dir.is_dir():
            return []
        return sorted((p for p in self.dir.iterdir() if p.is_dir() and p.name.startswith(TAG_PREFIX)),
                      key=lambda p: p.name, reverse=True)

    def save(self, engine, step: int, client_state: dict[str, Any]) -> Path:
        """Collective: every rank calls it."""
        tag = f"{TAG_PREFIX}{step:08d}"
        tag_dir = self.dir / tag
        if self.rank == 0 and tag_dir.exists():  # a torn attempt at the same step
            shutil.rmtree(tag_dir)
        dist.barrier()
        engine.save_checkpoint(str(self.dir), tag=tag, client_state=client_state, save_latest=False)
        torch.save({"torch": torch.get_rng_state()}, tag_dir / f"rng_rank{self.rank:05d}.pt")
        dist.barrier()  # every rank has written its files
        if self.rank == 0:
            _atomic_write(tag_dir / "checksums.json", json.dumps(_checksums(tag_dir), indent=1, sort_keys=True))
            _atomic_write(self.dir / "latest", tag)
            self._prune()
        dist.barrier()
        return tag_dir

    def _prune(self) -> None:
        complete = [t for t in self.tags() if (t / "checksums.json").exists()]
        for old in complete[self.keep_last:]:
            shutil.rmtree(old, ignore_errors=True)

    def newest_valid(self) -> str | None:
        """Rank 0 picks the newest verified checkpoint (warning about every one it skips); all ranks
        receive the same answer."""
        choice = [None]
        if self.rank == 0:
            for tag_dir in self.tags():
                problem = verify(tag_dir)
                if problem is None:
                    choice[0] = tag_dir.name
                    break
                warnings.warn(f"skipping checkpoint {tag_dir}: {problem}", stacklevel=2)
        dist.broadcast_object_list(choice, src=0)
        return choice[0]

    def load(self, engine, tag: str) -> dict[str, Any]:
        """Collective: restore engine state and this rank's RNG; returns the client state."""
        _, client_state = engine.load_checkpoint(str(self.dir), tag=tag, load_optimizer_states=True,
                                                 load_lr_scheduler_states=True)
        rng_file = self.dir / tag / f"rng_rank{self.rank:05d}.pt"
        if rng_file.exists():
            torch.set_rng_state(torch.load(rng_file)["torch"])
        return client_state
