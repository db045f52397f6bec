"""Document readers: plain text (one document per file), JSONL (one per line), Parquet (one per row),
text and JSONL optionally .gz/.zst compressed. Each yields (document, line or row) for the valid ones
and reports every other item with its file and line; nothing a file contains raises past it.

Invalid UTF-8 policy: bytes that are not valid UTF-8 are replaced by U+FFFD (the document is kept and
a warning is recorded), so decoding the shards reproduces the replaced text. A JSON string escape
that names a lone surrogate (`"\\ud800"`) cannot be encoded at all: that document is skipped.

Memory does not grow with the input: JSONL lines are read at most --max-doc-mb at a time (a longer
line is skipped while it streams past), text files are read up to that bound. Parquet is read one row
group at a time, in record batches; a row group whose text column the file's metadata says
decompresses to more than --max-row-group-mb is skipped unread (a few kB of zstd can expand to
gigabytes, and Arrow decompresses a page whole), and values over --max-doc-mb are skipped by their
length, before they are copied out of Arrow. What is not covered: a crafted file whose metadata
understates its pages' size (Arrow trusts each page header).
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import zlib
from typing import IO, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import zstandard

from data_prep.report import Report
from data_prep.sources import InputFile, open_regular

BINARY_SNIFF = 8192
DISCARD_CHUNK = 1 << 20   # how much of an over-long line is read at a time while skipping it
PARQUET_BATCH = 256       # rows per record batch
SLICE_BYTES = 64 << 20    # Parquet values are copied out of Arrow at most this many bytes at a time
# Errors that end the reading of one file (what was read before is kept): I/O, truncated or corrupt
# compression (zlib.error for a damaged deflate block, BadGzipFile is an OSError), corrupt Parquet.
FILE_ERRORS = (OSError, EOFError, zlib.error, zstandard.ZstdError, pa.ArrowException)

Docs = Iterator[tuple[str, int | None]]


@contextlib.contextmanager
def _open(f: InputFile) -> Iterator[IO[bytes]]:
    with open_regular(f.path) as raw:
        if f.compression == "gz":
            with gzip.GzipFile(fileobj=raw, mode="rb") as fh:
                yield fh
        elif f.compression == "zst":
            with io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=False)) as fh:
                yield fh
        else:
            yield raw


def _decode(data: bytes, f: InputFile, line: int | None, report: Report) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        report.warn("invalid UTF-8 (replaced with U+FFFD)", f.path, line)
        return data.decode("utf-8", errors="replace")


def bounded_lines(fh: IO[bytes], max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line) for every line, None for a line of more than max_bytes (newline excluded).
    No line is ever held past max_bytes + 1 bytes: a longer one is read through and dropped in
    DISCARD_CHUNK pieces up to its newline, so a 10 GB line costs no more memory than a short one."""
    n = 0
    while raw := fh.readline(max_bytes + 1):
        n += 1
        if len(raw) > max_bytes and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = fh.readline(DISCARD_CHUNK)
            yield n, None
        else:
            yield n, raw


def _text_docs(f: InputFile, max_bytes: int, report: Report) -> Docs:
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


def _parse_json(raw: bytes, f: InputFile, n: int, report: Report):
    """The parsed line, or None after reporting why it cannot be parsed."""
    try:
        return json.loads(_decode(raw, f, n, report))
    except json.JSONDecodeError as e:
        report.skip("malformed JSON", f.path, n, e.msg)
    except RecursionError:  # valid JSON nested deeper than the interpreter's recursion limit
        report.skip("JSON nested too deeply", f.path, n)
    except ValueError as e:  # e.g. an integer of more than 4300 digits (int_max_str_digits)
        report.skip("unparseable JSON", f.path, n, str(e)[:200])
    return None


def _jsonl_docs(f: InputFile, field: str, max_bytes: int, report: Report) -> Docs:
    with _open(f) as fh:
        if b"\0" in fh.peek(BINARY_SNIFF)[:BINARY_SNIFF]:
            report.skip("binary file", f.path)
            return
        n = 0
        for n, raw in bounded_lines(fh, max_bytes):
            if raw is None:
                report.skip("document too large", f.path, n, f"line over {max_bytes} bytes")
                continue
            if not raw.strip() or (obj := _parse_json(raw, f, n, report)) is None:
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


def is_text_column(t: pa.DataType) -> bool:
    """Arrow string columns in any layout: string, large_string, string_view, or dictionary-encoded."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _values(column: pa.DictionaryArray, max_bytes: int) -> Iterator[bytes | int | None]:
    """Each row of a dictionary-read string column: its raw bytes, None for null, or its length (an
    int) when over max_bytes. Lengths come from the dictionary's offsets, so an over-long value is
    never copied, and rows are copied out of Arrow in slices of at most SLICE_BYTES (or one document):
    one small dictionary value repeated down many rows never becomes a large batch at once. Bytes are
    decoded by the caller (not by Arrow, which raises on the first invalid UTF-8 value) so that each
    value follows the invalid-UTF-8 policy on its own."""
    lengths = pc.take(pc.binary_length(column.dictionary), column.indices).to_pylist()
    kept = [n if n is not None and n <= max_bytes else None for n in lengths]  # the lengths to copy
    start = 0
    while start < len(lengths):
        end, size = start, 0
        while end < len(lengths) and (end == start or size + (kept[end] or 0) <= SLICE_BYTES):
            size += kept[end] or 0
            end += 1
        rows = [i for i in range(start, end) if kept[i] is not None]
        values = iter(column.dictionary.take(column.indices.take(pa.array(rows, pa.int64())))
                      .cast(pa.large_binary()).to_pylist() if rows else ())
        for i in range(start, end):
            yield next(values) if kept[i] is not None else lengths[i]
        start = end


def _row_group_fits(pf: pq.ParquetFile, group: int, column: str, first_row: int, limit: int, f: InputFile,
                    report: Report) -> bool:
    """Whether the text column of one row group decompresses (by the file's metadata) to at most
    `limit` bytes; else it is reported and never read: one page of a few kB of zstd can hold
    gigabytes, and Arrow decompresses a whole page at once."""
    meta = pf.metadata.row_group(group)
    size = next((meta.column(j).total_uncompressed_size for j in range(meta.num_columns)
                if meta.column(j).path_in_schema == column), 0)
    if size <= limit:
        return True
    report.skip("Parquet row group too large (not read)", f.path, first_row + 1,
                f"row group {group} (rows {first_row + 1}-{first_row + meta.num_rows}): column '{column}' "
                f"decompresses to {size / 2**20:.0f} MB, over --max-row-group-mb={limit / 2**20:g}")
    return False


def _parquet_docs(f: InputFile, column: str, max_bytes: int, group_bytes: int, report: Report) -> Docs:
    if f.compression:
        report.skip("compressed Parquet is not supported (Parquet compresses internally)", f.path)
        return
    with open_regular(f.path) as fh:
        meta = pq.ParquetFile(fh).metadata
        schema = meta.schema.to_arrow_schema()
        if column not in schema.names:
            report.skip(f"missing column '{column}'", f.path, detail=f"columns: {', '.join(schema.names)}")
            return
        if not is_text_column(schema.field(column).type):
            report.skip(f"column '{column}' is not a string column", f.path, detail=str(schema.field(column).type))
            return
        # buffer_size: column chunks are read in 1 MiB pieces rather than whole; read_dictionary:
        # values arrive as a dictionary and indices, so lengths are known before any value is copied.
        pf = pq.ParquetFile(fh, metadata=meta, buffer_size=1 << 20, read_dictionary=[column])
        row = 0
        for group in range(pf.num_row_groups):
            if not _row_group_fits(pf, group, column, row, group_bytes, f, report):
                row += meta.row_group(group).num_rows
                continue
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH, row_groups=[group], columns=[column]):
                for value in _values(batch.column(0), max_bytes):
                    row += 1
                    if value is None:
                        report.skip(f"missing field '{column}' (null)", f.path, row)
                    elif isinstance(value, int):
                        report.skip("document too large", f.path, row, f"over {max_bytes} bytes")
                    elif not (text := _decode(value, f, row, report)).strip():
                        report.skip("empty document", f.path, row)
                    else:
                        yield text, row
    if row == 0:
        report.skip("empty file", f.path)


def read_documents(f: InputFile, field: str, max_bytes: int, report: Report, group_bytes: int = 1 << 30) -> Docs:
    """(text, line or row) for every valid document of a file; a read error ends the file with a report
    (documents yielded before it are kept). Every text yielded encodes as UTF-8: the tokenizer and the
    split hash need that, and one bad document must never stop the run."""
    readers = {"text": lambda: _text_docs(f, max_bytes, report),
               "jsonl": lambda: _jsonl_docs(f, field, max_bytes, report),
               "parquet": lambda: _parquet_docs(f, field, max_bytes, group_bytes, report)}
    try:
        for text, line in readers[f.fmt]():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                report.skip("lone surrogate (not valid Unicode)", f.path, line,
                            f"U+{ord(text[e.start]):04X} at character {e.start}")
                continue
            yield text, line
    except FILE_ERRORS as e:
        report.skip("unreadable or corrupt file (stopped reading)", f.path, detail=f"{type(e).__name__}: {e}")
