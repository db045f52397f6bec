"""Checking a dataset split's `index.json` before anything reads a shard.

An MDS index is a file other people wrote. Read as-is by mosaicml-streaming it can make a reader
unpickle (`pkl` columns), parse arbitrary JSON (`json` columns), or write a decompressed shard
wherever `raw_data.basename` points (an absolute path or `..`). `check_split` accepts only what
rgpt-prep writes: version 2 MDS shards with one `tokens` column of fixed-length uint16 arrays, shard
files named by relative paths that stay inside the split directory, with the recorded sizes. Every
refusal is a `DatasetError` naming the index file and the shard.
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Any

MAX_INDEX_BYTES = 64 << 20  # a 1 TB dataset of 64 MB shards has an index of ~8 MB
TOKEN_ENCODING = re.compile(r"ndarray:uint16:([1-9][0-9]{0,6})")
SHARD_KEYS = {"column_encodings", "column_names", "column_sizes", "compression", "format", "hashes", "raw_data",
              "samples", "size_limit", "version", "zip_data"}
COMPRESSIONS = re.compile(r"(br|bz2|gz|snappy|zstd)(:[0-9]{1,2})?")


class DatasetError(ValueError):
    """A dataset that cannot be read safely or is not an rgpt-prep dataset, with file and reason."""


def load_index(index_file: Path) -> dict[str, Any]:
    """The parsed index.json (a regular file of bounded size, UTF-8 JSON); DatasetError otherwise."""
    try:
        st = os.lstat(index_file)
    except FileNotFoundError:
        raise DatasetError(f"{index_file.parent} has no index.json: not an rgpt-prep dataset split") from None
    if not stat.S_ISREG(st.st_mode):
        raise DatasetError(f"{index_file}: not a regular file")
    if st.st_size > MAX_INDEX_BYTES:
        raise DatasetError(f"{index_file}: {st.st_size} bytes, larger than any rgpt-prep index")
    try:
        obj = json.loads(index_file.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise DatasetError(f"{index_file}: not a JSON index ({str(e)[:200]})") from None
    if not isinstance(obj, dict) or obj.get("version") != 2 or not isinstance(obj.get("shards"), list):
        raise DatasetError(f"{index_file}: not a version 2 MDS index (expected {{'version': 2, 'shards': [...]}})")
    return obj


def safe_member(split_dir: Path, name: Any, where: str) -> Path:
    """split_dir / name for a shard file name from an index: relative, no `..`, and (links
    resolved) inside split_dir."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        raise DatasetError(f"{where}: bad shard file name {name!r}")
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts:
        raise DatasetError(f"{where}: shard file name {name!r} leaves the split directory")
    path = split_dir / pure
    try:
        inside = path.resolve().is_relative_to(split_dir.resolve())
    except OSError as e:  # a name too long, a link loop
        raise DatasetError(f"{where}: shard file {name[:80]!r}: {e.strerror}") from None
    if not inside:
        raise DatasetError(f"{where}: shard file {name!r} resolves outside {split_dir} (a link?)")
    return path


def _file_info(info: Any, where: str) -> tuple[str, int]:
    if not isinstance(info, dict) or set(info) != {"basename", "bytes", "hashes"} \
            or not isinstance(info["hashes"], dict):
        raise DatasetError(f"{where}: not a file record {{basename, bytes, hashes}}")
    size = info.get("bytes")
    if type(size) is not int or size < 0:
        raise DatasetError(f"{where}: bad byte count {size!r}")
    return info["basename"], size


def check_shard(split_dir: Path, shard: Any, where: str, local: bool = True) -> int:
    """Validate one shard record; returns its sample length (tokens per sample). With `local`, the
    file it reads (the compressed one if compressed) must exist with the recorded size."""
    if not isinstance(shard, dict) or shard.get("format") != "mds" or shard.get("version") != 2:
        raise DatasetError(f"{where}: not a version 2 MDS shard record")
    if set(shard) != SHARD_KEYS:
        raise DatasetError(f"{where}: shard record keys {sorted(shard)} are not MDS's {sorted(SHARD_KEYS)}")
    encodings, names = shard.get("column_encodings"), shard.get("column_names")
    if names != ["tokens"] or not isinstance(encodings, list) or len(encodings) != 1 \
            or not isinstance(encodings[0], str) or not TOKEN_ENCODING.fullmatch(encodings[0]):
        raise DatasetError(f"{where}: columns {names!r} encoded {encodings!r}; only one `tokens` column of "
                           f"fixed-length uint16 arrays (ndarray:uint16:N) is read (never pkl or json)")
    n_tokens = int(TOKEN_ENCODING.fullmatch(encodings[0]).group(1))
    if shard.get("column_sizes") != [2 * n_tokens]:
        raise DatasetError(f"{where}: column_sizes {shard.get('column_sizes')!r} do not match {encodings[0]}")
    samples = shard.get("samples")
    if type(samples) is not int or samples < 0:
        raise DatasetError(f"{where}: bad sample count {samples!r}")
    hashes, size_limit = shard.get("hashes"), shard.get("size_limit")
    if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes) \
            or not (size_limit is None or (type(size_limit) is int and size_limit > 0)):
        raise DatasetError(f"{where}: bad hashes {hashes!r} or size_limit {size_limit!r}")
    compression = shard.get("compression")
    if compression is not None and not (isinstance(compression, str) and COMPRESSIONS.fullmatch(compression)):
        raise DatasetError(f"{where}: unknown compression {compression!r}")
    raw_name, raw_bytes = _file_info(shard.get("raw_data"), f"{where} raw_data")
    safe_member(split_dir, raw_name, f"{where} raw_data")
    if not 4 * (samples + 2) + 2 * n_tokens * samples <= raw_bytes < 2**32:  # count, uint32 offsets, samples
        raise DatasetError(f"{where}: {raw_bytes} bytes cannot hold {samples} samples of {n_tokens} tokens")
    read_name, read_bytes = raw_name, raw_bytes
    if compression is not None:
        read_name, read_bytes = _file_info(shard.get("zip_data"), f"{where} zip_data")
        safe_member(split_dir, read_name, f"{where} zip_data")
    elif shard.get("zip_data") is not None:
        raise DatasetError(f"{where}: zip_data without compression")
    if local:
        path = split_dir / read_name
        try:
            have = path.stat().st_size if path.is_file() else "no file"
        except OSError as e:
            have = e.strerror
        if have != read_bytes:
            raise DatasetError(f"{where}: {str(path)[:300]} should be a file of {read_bytes} bytes ({have})")
    return n_tokens


def check_split(split_dir: str | Path, local: bool = True) -> list[dict[str, Any]]:
    """The validated shard records of split_dir/index.json (all with the same sample length)."""
    split_dir = Path(split_dir)
    index_file = split_dir / "index.json"
    shards = load_index(index_file)["shards"]
    lengths = {check_shard(split_dir, s, f"{index_file} shard {i}", local) for i, s in enumerate(shards)}
    if len(lengths) > 1:
        raise DatasetError(f"{index_file}: shards of different sample lengths {sorted(lengths)}")
    return shards
