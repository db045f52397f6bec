"""GPT-2 BPE through tiktoken, usable offline.

The vocabulary (`gpt2.tiktoken`, the r50k_base ranks) is found, in order, at
  1. an explicit path (argument, e.g. `rgpt-prep --vocab PATH`),
  2. the environment variable RGPT_GPT2_VOCAB,
  3. the project cache, `$RGPT_CACHE_DIR/gpt2.tiktoken` (default ~/.cache/rgpt-dist), which
     `rgpt-prep --fetch-vocab` (or `make vocab`) fills from the openai-whisper source distribution
     on PyPI, the one public package that ships the file,
  4. tiktoken's own cache/download (`tiktoken.get_encoding("r50k_base")`),
and is always verified against its sha256. With none available, `VocabularyUnavailable` says how
to get one.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from functools import lru_cache
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from rgpt_dist.durable import atomic_write_bytes

GPT2_VOCAB_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT_TOKEN = 50256
N_VOCAB = 50257
WHISPER_SDIST = "openai-whisper==20250625"
# tiktoken's r50k pattern (tiktoken_ext.openai_public.r50k_pat_str), the GPT-2 pre-tokenizer.
R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
HOW_TO_GET = ("the GPT-2 vocabulary (gpt2.tiktoken) is not available offline. Get it with "
              "`rgpt-prep --fetch-vocab` (or `make vocab`), which downloads the openai-whisper source "
              "distribution from PyPI and extracts whisper/assets/gpt2.tiktoken into the cache; or pass "
              "--vocab PATH / set RGPT_GPT2_VOCAB to a copy (sha256 " + GPT2_VOCAB_SHA256 + ").")


class VocabularyUnavailable(RuntimeError):
    """No verified GPT-2 vocabulary could be found."""


def cache_dir() -> Path:
    return Path(os.environ.get("RGPT_CACHE_DIR", Path.home() / ".cache" / "rgpt-dist"))


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_vocab(path: str | Path | None = None) -> Path | None:
    """The first verified vocabulary file among the explicit path, RGPT_GPT2_VOCAB and the cache.
    An explicit path or variable that is missing or fails the hash is an error, not skipped."""
    for source, candidate in (("--vocab", path), ("RGPT_GPT2_VOCAB", os.environ.get("RGPT_GPT2_VOCAB"))):
        if candidate:
            candidate = Path(candidate)
            if not candidate.is_file():
                raise VocabularyUnavailable(f"{source}={candidate} does not exist")
            if sha256_file(candidate) != GPT2_VOCAB_SHA256:
                raise VocabularyUnavailable(f"{source}={candidate} is not gpt2.tiktoken (sha256 mismatch)")
            return candidate
    cached = cache_dir() / "gpt2.tiktoken"
    if cached.is_file() and sha256_file(cached) == GPT2_VOCAB_SHA256:
        return cached
    return None


@lru_cache(maxsize=4)
def _encoding_from_file(path: str) -> tiktoken.Encoding:
    ranks = load_tiktoken_bpe(path, expected_hash=GPT2_VOCAB_SHA256)
    return tiktoken.Encoding(name="gpt2", pat_str=R50K_PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT_TOKEN}, explicit_n_vocab=N_VOCAB)


def get_encoding(path: str | Path | None = None) -> tiktoken.Encoding:
    """The GPT-2 encoding (50,257 tokens, <|endoftext|> = 50256), offline when a vocabulary is local."""
    found = find_vocab(path)
    if found is not None:
        return _encoding_from_file(str(found.resolve()))
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # offline: ConnectionError and friends from the download attempt
        raise VocabularyUnavailable(f"{HOW_TO_GET} (tiktoken: {type(e).__name__})") from None


def fetch_vocab(dest_dir: str | Path | None = None) -> Path:
    """Download the openai-whisper sdist with pip, extract gpt2.tiktoken, verify it, and place it in
    the cache (atomically). Returns the file's path."""
    dest_dir = Path(dest_dir) if dest_dir else cache_dir()
    dest = dest_dir / "gpt2.tiktoken"
    if dest.is_file() and sha256_file(dest) == GPT2_VOCAB_SHA256:
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               "--dest", tmp, WHISPER_SDIST]
        done = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(tmp).glob("openai[-_]whisper-*.tar.gz"))
        if done.returncode != 0 or not sdists:
            raise VocabularyUnavailable(f"pip download {WHISPER_SDIST} failed: {done.stderr.strip()[-500:]}")
        with tarfile.open(sdists[0]) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken")), None)
            if member is None:
                raise VocabularyUnavailable(f"{sdists[0].name} has no whisper/assets/gpt2.tiktoken")
            data = tar.extractfile(member).read()
    if hashlib.sha256(data).hexdigest() != GPT2_VOCAB_SHA256:
        raise VocabularyUnavailable(f"gpt2.tiktoken from {WHISPER_SDIST} fails the sha256 check")
    atomic_write_bytes(dest, data)
    return dest
