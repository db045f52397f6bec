"""Hostile artifacts for the security tests: objects whose unpickling creates a marker file, so a
test can tell a refused payload from one that fired."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path


class Payload:
    """Unpickling it opens (creates) `marker` for appending: code named by the file runs."""

    def __init__(self, marker: str | Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "a"))


def poison_pt(path: Path, marker: Path, key: str = "payload") -> None:
    """Add a Payload under `key` to the (dict) .pt file at `path`, keeping everything else."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)  # our own test file: trusted
    state[key] = Payload(marker)
    torch.save(state, path)


def rewrite_checksums(tag_dir: Path) -> None:
    """Recompute checksums.json as an attacker would after editing files (verification passes)."""
    record = {str(p.relative_to(tag_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in sorted(tag_dir.rglob("*")) if p.is_file() and p.name != "checksums.json"}
    (tag_dir / "checksums.json").write_text(json.dumps(record))
