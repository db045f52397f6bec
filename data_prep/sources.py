"""Input discovery and document readers: plain text, JSONL, Parquet (and .gz/.zst variants of text
and JSONL), plus the built-in `python-stdlib` corpus. Every problem goes to the Report with its file
(and line); nothing raises past a file.

Invalid UTF-8 policy: bytes that are not valid UTF-8 are replaced by U+FFFD (the document is kept and
a warning is recorded), so decoding the shards reproduces the replaced text.
"""
from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import io
import json
import os
import sysconfig
from pathlib import Path
from typing import IO, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from data_prep.report import Report

STDLIB = "python-stdlib"
TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".java", ".js",
                 ".ts", ".go", ".rs", ".rb", ".sh", ".tex", ".html", ".htm", ".css", ".xml", ".yaml",
                 ".yml", ".toml", ".cfg", ".ini", ".csv", ".tsv", ".text"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}
PARQUET_SUFFIXES = {".parquet"}
COMPRESSIONS = {".gz": "gz", ".zst": "zst", ".zstd": "zst"}
BINARY_SNIFF = 8192


@dataclasses.dataclass(frozen=True)
class InputFile:
    path: str
    fmt: str                 # text | jsonl | parquet
    compression: str | None  # None | gz | zst
    size: int
    sha256: str


def classify(path: Path) -> tuple[str | None, str | None]:
    """(format, compression) from the file name; format None = not a recognised corpus file."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    if last in JSONL_SUFFIXES:
        return "jsonl", compression
    if last in PARQUET_SUFFIXES:
        return "parquet", compression
    if last in TEXT_SUFFIXES:
        return "text", compression
    return None, compression


def stdlib_files() -> list[Path]:
    """The local CPython standard library sources (site-packages excluded), one document per file."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "__pycache__" not in p.parts)


def _expand(spec: str, report: Report) -> list[tuple[Path, bool]]:
    """(path, explicitly named) pairs for one command-line input."""
    if spec == STDLIB:
        return [(p, False) for p in stdlib_files()]
    if any(c in spec for c in "*?["):
        matches = sorted(glob.glob(spec, recursive=True))
        if not matches:
            report.skip("no file matches the pattern", spec)
        return [(Path(m), False) for m in matches if not Path(m).is_dir()]
    path = Path(spec)
    if path.is_dir():
        found = []
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            found += [(Path(dirpath) / f, False) for f in sorted(filenames)]
        return found
    if path.exists() or path.is_symlink():
        return [(path, True)]
    report.skip("input does not exist", spec)
    return []


def _hash(path: Path) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()


def discover(specs: list[str], report: Report) -> list[InputFile]:
    """Expand inputs into files (command-line order, directories sorted), hash them, drop duplicates."""
    files, seen_paths, seen_hashes = [], set(), {}
    for spec in specs:
        for path, explicit in _expand(spec, report):
            fmt, compression = classify(path)
            if fmt is None and not explicit:
                report.skip("unsupported file type", str(path))
                continue
            fmt = fmt or "text"  # a file named explicitly is read as text whatever its name
            real = os.path.realpath(path)
            if real in seen_paths:
                report.skip("duplicate input (same file)", str(path))
                continue
            seen_paths.add(real)
            try:
                size, digest = _hash(path)
            except OSError as e:
                report.skip("unreadable file", str(path), detail=e.strerror or type(e).__name__)
                continue
            if digest in seen_hashes:
                report.skip("duplicate input (same content)", str(path), detail=f"as {seen_hashes[digest]}")
                continue
            seen_hashes[digest] = str(path)
            files.append(InputFile(str(path), fmt, compression, size, digest))
    return files


def _open(f: InputFile) -> IO[bytes]:
    if f.compression == "gz":
        return gzip.open(f.path, "rb")
    if f.compression == "zst":
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(f.path, "rb"), closefd=True))
    return open(f.path, "rb")


def _decode(data: bytes, f: InputFile, line: int | None, report: Report) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        report.warn("invalid UTF-8 (replaced with U+FFFD)", f.path, line)
        return data.decode("utf-8", errors="replace")


def _text_docs(f: InputFile, max_bytes: int, report: Report) -> Iterator[tuple[str, int | None]]:
    with _open(f) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        report.skip("document too large", f.path, detail=f"over {max_bytes} bytes")
    elif not data.strip():
        report.skip("empty file", f.path)
    elif b"\0" in data[:BINARY_SNIFF]:
        report.skip("binary file", f.path)
    else:
        yield _decode(data, f, None, report), None


def _jsonl_docs(f: InputFile, field: str, max_bytes: int, report: Report) -> Iterator[tuple[str, int | None]]:
    with _open(f) as fh:
        head = fh.peek(BINARY_SNIFF)[:BINARY_SNIFF] if hasattr(fh, "peek") else b""
        if b"\0" in head:
            report.skip("binary file", f.path)
            return
        n = 0
        for n, raw in enumerate(fh, start=1):
            if len(raw) > max_bytes:
                report.skip("document too large", f.path, n, f"line over {max_bytes} bytes")
                continue
            if not raw.strip():
                continue
            try:
                obj = json.loads(_decode(raw, f, n, report))
            except json.JSONDecodeError as e:
                report.skip("malformed JSON", f.path, n, e.msg)
                continue
            if not isinstance(obj, dict):
                report.skip("not a JSON object", f.path, n)
            elif field not in obj:
                report.skip(f"missing field '{field}'", f.path, n)
            elif not isinstance(obj[field], str):
                report.skip(f"field '{field}' is not a string", f.path, n, type(obj[field]).__name__)
            elif not obj[field].strip():
                report.skip("empty document", f.path, n)
            else:
                yield obj[field], n
        if n == 0:
            report.skip("empty file", f.path)


def _parquet_docs(f: InputFile, column: str, max_bytes: int, report: Report) -> Iterator[tuple[str, int | None]]:
    if f.compression:
        report.skip("compressed Parquet is not supported (Parquet compresses internally)", f.path)
        return
    pf = pq.ParquetFile(f.path)
    schema = pf.schema_arrow
    if column not in schema.names:
        report.skip(f"missing column '{column}'", f.path, detail=f"columns: {', '.join(schema.names)}")
        return
    if not (pa.types.is_string(schema.field(column).type) or pa.types.is_large_string(schema.field(column).type)):
        report.skip(f"column '{column}' is not a string column", f.path, detail=str(schema.field(column).type))
        return
    row = 0
    for batch in pf.iter_batches(batch_size=1024, columns=[column]):  # never the whole file in memory
        for value in batch.column(0).to_pylist():
            row += 1
            if value is None:
                report.skip(f"missing field '{column}' (null)", f.path, row)
            elif len(value.encode("utf-8", "surrogatepass")) > max_bytes:
                report.skip("document too large", f.path, row, f"over {max_bytes} bytes")
            elif not value.strip():
                report.skip("empty document", f.path, row)
            else:
                yield value, row
    if row == 0:
        report.skip("empty file", f.path)


def read_documents(f: InputFile, field: str, max_bytes: int, report: Report) -> Iterator[tuple[str, int | None]]:
    """(text, line or row) for every valid document of a file; a read error ends the file with a report
    (documents yielded before it are kept)."""
    readers = {"text": lambda: _text_docs(f, max_bytes, report),
               "jsonl": lambda: _jsonl_docs(f, field, max_bytes, report),
               "parquet": lambda: _parquet_docs(f, field, max_bytes, report)}
    try:
        yield from readers[f.fmt]()
    except (OSError, EOFError, zstandard.ZstdError, pa.ArrowException) as e:
        report.skip("unreadable or corrupt file (stopped reading)", f.path, detail=f"{type(e).__name__}: {e}")
