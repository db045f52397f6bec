"""Checking what a split's shard files hold, before anything trains or evaluates on them.

`check_split` (index.py) checks the index; this checks the shard files against it. mosaicml-streaming
trusts both: an offset past the end of a shard surfaces as an IndexError (or a short sample) in the
middle of a run, and a token id at or above the model's vocabulary as an IndexError in the embedding
lookup (a device-side assert on a GPU), possibly hours in. Run by the trainer's preflight and by
rgpt-eval; every refusal is a DatasetError naming the shard file and the sample.

An MDS shard (streaming/base/format/mds/writer.py, `encode_joint_shard`) is: uint32 sample count n,
n + 1 uint32 offsets (absolute byte positions: sample j is bytes [offsets[j], offsets[j + 1])), the
writer's JSON config, then the samples. A sample of fixed-size columns is their bytes back to back,
so each of ours is exactly 2 x N bytes (one `ndarray:uint16:N` column).

Cost. The layout check reads only the offsets table (4 bytes per sample: ~40 MB for a 20 GB dataset
of 1025-token samples). The token check reads every token: a vectorised max over the memory-mapped
file, CHUNK tokens at a time: measured on one core of the build machine, 1 GiB from the page cache,
24.6 GB/s (18.5 GB/s when the samples start at an odd byte, as the writer's config length decides),
so a 20 GB dataset costs about 1 s warm and its read time from disk cold; every rank reads it (the
page cache serves the ranks of a node after the first). Compressed shards are decompressed in memory
(MDS shards are < 4 GiB; zstd at about 1 GB/s), unless the decompressed file is already in the
split, which is what streaming then reads.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from rgpt_dist.data.index import DatasetError
from rgpt_dist.data.mds import import_streaming

CHUNK = 1 << 26  # tokens per vectorised step (128 MB): bounds the temporaries of the comparison


def check_layout(data: np.ndarray, samples: int, n_tokens: int, where: str) -> int:
    """Check a shard's bytes (uint8 array) against its index record; return where the samples start."""
    size, table = data.size, 4 * (samples + 2)
    if size < table:
        raise DatasetError(f"{where}: {size} bytes, too short for the offsets table of {samples} samples")
    count = int(data[:4].view(np.uint32)[0])
    if count != samples:
        raise DatasetError(f"{where}: the file holds {count} samples, the index records {samples}")
    offsets = data[4:table].view(np.uint32).astype(np.int64)
    if offsets[0] < table:
        raise DatasetError(f"{where}: sample 0 starts at byte {offsets[0]}, inside the offsets table")
    past = np.flatnonzero(offsets > size)
    if past.size:
        k = int(past[0])
        raise DatasetError(f"{where}: sample {max(k - 1, 0)} {'ends' if k else 'starts'} at byte {offsets[k]}, "
                           f"past the end of the file ({size} bytes)")
    wrong = np.flatnonzero(np.diff(offsets) != 2 * n_tokens)
    if wrong.size:
        j = int(wrong[0])
        raise DatasetError(f"{where}: sample {j} spans bytes {offsets[j]}..{offsets[j + 1]}, not one sample of "
                           f"{n_tokens} uint16 tokens ({2 * n_tokens} bytes)")
    if offsets[-1] != size:
        raise DatasetError(f"{where}: the samples end at byte {offsets[-1]}, not at the end of the file ({size} bytes)")
    return int(offsets[0])


def check_tokens(data: np.ndarray, start: int, n_tokens: int, vocab_size: int, where: str) -> None:
    """Every token id below vocab_size (the samples are contiguous from `start`: check_layout)."""
    tokens = data[start:].view(np.uint16)
    for c in range(0, tokens.size, CHUNK):
        chunk = tokens[c:c + CHUNK]
        if chunk.size and int(chunk.max()) >= vocab_size:
            i = c + int(np.argmax(chunk >= vocab_size))
            raise DatasetError(f"{where}: sample {i // n_tokens} holds token id {int(tokens[i])} (position "
                               f"{i % n_tokens}), not below the model's vocabulary size {vocab_size}")


def check_shard_data(data: np.ndarray, samples: int, n_tokens: int, vocab_size: int | None, where: str) -> None:
    """The layout and (with vocab_size) the token ids of one shard's (decompressed) bytes."""
    start = check_layout(data, samples, n_tokens, where)
    if vocab_size is not None:
        check_tokens(data, start, n_tokens, vocab_size, where)


def map_file(path: Path) -> np.ndarray:
    """A file's bytes as a read-only uint8 array, memory-mapped (an empty file cannot be mapped)."""
    if os.stat(path).st_size == 0:
        return np.empty(0, np.uint8)
    return np.memmap(path, np.uint8, mode="r")


def check_split_data(split_dir: str | Path, shards: list[dict[str, Any]], vocab_size: int | None) -> None:
    """Every shard of a local split (records from check_split), as streaming will read it: the
    decompressed file when it is in the split (streaming then never decompresses), else the
    compressed one decompressed here, in memory."""
    split_dir = Path(split_dir)
    for i, info in enumerate(shards):
        samples, n_tokens = info["samples"], info["column_sizes"][0] // 2
        raw = split_dir / info["raw_data"]["basename"]
        if info["compression"] is None or raw.is_file():
            check_shard_data(map_file(raw), samples, n_tokens, vocab_size, f"{raw} (shard {i})")
            continue
        zipped, decompress = split_dir / info["zip_data"]["basename"], import_streaming().base.compression.decompress
        data = np.frombuffer(decompress(info["compression"], zipped.read_bytes()), np.uint8)
        if data.size != info["raw_data"]["bytes"]:
            raise DatasetError(f"{zipped} (shard {i}): decompresses to {data.size} bytes, not the "
                               f"{info['raw_data']['bytes']} its index records")
        check_shard_data(data, samples, n_tokens, vocab_size, f"{zipped} (shard {i}, decompressed)")
