"""Reading rgpt-prep's output back, and the checks every data_prep test shares."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
EOT = 50256


def read_split(out: Path, split: str) -> np.ndarray:
    """All samples of a split in order, (n, seq_len + 1), read through mosaicml-streaming."""
    from rgpt_dist.data.mds import import_streaming
    if not json.loads((out / split / "index.json").read_text())["shards"]:  # streaming cannot open it
        return np.zeros((0, manifest(out)["sample_tokens"]), np.uint16)
    ds = import_streaming().LocalDataset(local=str(out / split))
    return np.stack([ds[i]["tokens"] for i in range(len(ds))])


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def expected_split(text: str, fraction: float) -> str:
    """The documented rule, re-implemented: val iff blake2b-64(UTF-8) < fraction * 2^64."""
    h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return "val" if h < fraction * 2**64 else "train"


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def assert_conserved(out: Path, docs: list[str], fraction: float, encoding) -> None:
    """Token conservation for a one-part dataset: per split, the samples are exactly the start of the
    token stream of the expected documents (in input order, <|endoftext|> after each), the manifest's
    token count is that stream's length, and only the final partial sample is missing."""
    m = manifest(out)
    n = m["sample_tokens"]
    for split in ("train", "val"):
        mine = [d for d in docs if expected_split(d, fraction) == split]
        stream = [t for d in mine for t in encoding.encode_ordinary(d) + [EOT]]
        samples = read_split(out, split)
        s = m["splits"][split]
        assert s["documents"] == len(mine), split
        assert s["tokens"] == len(stream) == samples.size + s["remainder_tokens"], split
        assert len(stream) - samples.size < n and s["samples"] == len(stream) // n, split
        assert samples.flatten().tolist() == stream[: samples.size], split


def prep(*args: str, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """rgpt-prep in a subprocess, with a timeout so that a hang fails the test instead of stalling it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        return subprocess.run([sys.executable, "-m", "data_prep.cli", *args, "--no-progress"], env=env,
                              capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"rgpt-prep hung (killed after {timeout} s): {e.stderr!r}") from None
