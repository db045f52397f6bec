"""RGPT_SAMPLE_LOG=DIR: the first tensor-parallel rank of every data-parallel replica (its tp
peers read the same samples) appends, for each training micro-batch, the optimizer step it
belongs to (1-based, as the metrics records number steps) and an 8-byte blake2b hash of each
sequence in it, to DIR/rank<R>.jsonl. For audits and tests of the data stream: that a run resumed
at another layout (or after a requeue) reads exactly the next global samples, none skipped or
repeated. Off unless set; when set it costs a hash of each micro-batch's tokens (a few microseconds
per sequence) and a line per micro-batch."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

ENV = "RGPT_SAMPLE_LOG"


class SampleLog:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "a", encoding="utf-8")

    @classmethod
    def from_env(cls, rank: int) -> "SampleLog | None":
        where = os.environ.get(ENV)
        return cls(Path(where) / f"rank{rank}.jsonl") if where else None

    def record(self, step: int, tokens: torch.Tensor) -> None:
        """tokens: (micro_batch, seq_len) inputs of one micro-batch of optimizer step `step`."""
        rows = tokens.detach().to("cpu", torch.int64).numpy()
        ids = [hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest() for row in rows]
        self.fh.write(json.dumps({"step": step, "ids": ids}) + "\n")
        self.fh.flush()


def read_sample_log(where: str | Path) -> dict[int, list[str]]:
    """step -> the sample ids of that step over every rank's file (a later line for a step replaces
    nothing: a step trained twice, before and after a resume, lists its samples twice)."""
    out: dict[int, list[str]] = {}
    for path in sorted(Path(where).glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            out.setdefault(rec["step"], []).extend(rec["ids"])
    return out
