"""Small corpora written into a temp dir for the data_prep tests."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard


def good_corpus(root: Path) -> dict[str, list[str]]:
    """Every supported format; returns {file: [documents in order]} as the pipeline should accept them."""
    root.mkdir(parents=True, exist_ok=True)
    docs: dict[str, list[str]] = {}
    (root / "a.txt").write_text("Hello world.\nThe second line, ü and 日本語.\n")
    docs["a.txt"] = [(root / "a.txt").read_text()]
    (root / "b.md").write_text("# Title\n\nSome *markdown* <|endoftext|> literal special text.\n")
    docs["b.md"] = [(root / "b.md").read_text()]
    lines = [f"JSON document number {i}: " + "words " * (i % 7 + 1) for i in range(40)]
    (root / "c.jsonl").write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(lines)))
    docs["c.jsonl"] = lines
    gz = [f"gzip line {i} " * 3 for i in range(15)]
    with gzip.open(root / "d.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in gz)
    docs["d.jsonl.gz"] = gz
    zs = [f"zstd line {i}\n\n" * 2 for i in range(15)]
    (root / "e.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps({"text": t}) + "\n" for t in zs).encode()))
    docs["e.jsonl.zst"] = zs
    pq_docs = [f"parquet row {i} " + "x" * i for i in range(30)]
    pq.write_table(pa.table({"text": pq_docs, "n": list(range(30))}), root / "f.parquet", row_group_size=7)
    docs["f.parquet"] = pq_docs
    with gzip.open(root / "g.txt.gz", "wt") as f:
        f.write("A gzipped plain text document.\n")
    docs["g.txt.gz"] = ["A gzipped plain text document.\n"]
    return docs


def bad_corpus(root: Path) -> dict[str, int]:
    """One of each bad case; returns the expected skip counts by reason."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "empty.txt").write_text("")
    (root / "binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 10)
    (root / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))  # kept, with U+FFFD
    (root / "ok.txt").write_text("A perfectly fine document.\n")
    (root / "copy_of_ok.txt").write_text("A perfectly fine document.\n")
    (root / "big.txt").write_text("y" * 5000)
    (root / "mixed.jsonl").write_text("\n".join([
        json.dumps({"text": "valid one"}),
        "{not json",
        json.dumps({"body": "no text field"}),
        json.dumps({"text": 42}),
        json.dumps(["a", "list"]),
        json.dumps({"text": ""}),
        json.dumps({"text": "z" * 5000}),
        json.dumps({"text": "valid two"}),
    ]) + "\n")
    pq.write_table(pa.table({"body": ["no text column"]}), root / "nocol.parquet")
    pq.write_table(pa.table({"text": ["row one", None, "row three"]}), root / "nulls.parquet")
    lines = "".join(json.dumps({"text": f"line {i} {hashlib.sha1(str(i).encode()).hexdigest()}"}) + "\n"
                    for i in range(3000))
    (root / "corrupt.jsonl.gz").write_bytes(gzip.compress(lines.encode())[:-2000])  # cut near the end
    os.symlink(root / "does-not-exist.txt", root / "dangling.txt")
    (root / "image.png").write_bytes(b"\x89PNG")
    return {"empty file": 1, "binary file": 1, "duplicate input (same content)": 1, "document too large": 2,
            "malformed JSON": 1, "missing field 'text'": 1, "field 'text' is not a string": 1,
            "not a JSON object": 1, "empty document": 1, "missing column 'text'": 1,
            "missing field 'text' (null)": 1, "unreadable or corrupt file (stopped reading)": 1,
            "unreadable file": 1, "unsupported file type": 1}


def corrupt_gzip_lines(n: int = 300) -> tuple[bytes, list[str]]:
    """A two-member .jsonl.gz: n good lines, then a member whose deflate data starts with a reserved
    block type, so that reading raises zlib.error (not an OSError) right after the good lines.
    Returns the bytes and the documents that must be kept."""
    import zlib

    docs = [f"gzip document {i}" for i in range(n)]
    good = gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in docs).encode(), mtime=0)
    bad = good[:10] + b"\x07" + bytes(64)  # gzip header, then BTYPE=11 (reserved)
    try:
        zlib.decompressobj(-zlib.MAX_WBITS).decompress(bad[10:])
        raise AssertionError("the damaged member decompresses")
    except zlib.error:
        return good + bad, docs


def hostile_corpus(root: Path, outside: Path) -> dict:
    """Input that broke rgpt-prep's contract, beside valid documents (use --max-doc-mb 0.2). Returns
    {"docs": {file name: its valid documents in order}, "direct": inputs to name on the command line}."""
    root.mkdir(parents=True)
    outside.mkdir(parents=True)
    docs: dict[str, list[str]] = {}
    big = json.dumps({"text": "q" * 300000})  # over --max-doc-mb 0.2 (209715 bytes)
    lines = [json.dumps({"text": "first valid line"}),
             '{"text": "lone \\ud800 surrogate"}',
             "[" * 100000,                                   # RecursionError in json
             '{"text": ' + "7" * 5000 + "}",                 # ValueError: int_max_str_digits
             '{"text": "a pair \\ud83d\\ude00 is fine"}',
             big,
             json.dumps({"text": "after the long line"}),
             '{"text": "low \\udc80 half"}',
             json.dumps({"text": "last line, no newline"})]
    (root / "a_lines.jsonl").write_text("\n".join(lines))
    docs["a_lines.jsonl"] = ["first valid line", "a pair \U0001F600 is fine", "after the long line",
                             "last line, no newline"]
    dictionary = pa.array(["alpha doc", "beta doc", "alpha doc", None, "gamma doc"]).dictionary_encode()
    pq.write_table(pa.table({"text": dictionary}), root / "b_dict.parquet")
    docs["b_dict.parquet"] = ["alpha doc", "beta doc", "alpha doc", "gamma doc"]
    pq.write_table(pa.table({"text": pa.array(["large one", "large two"], pa.large_string())}), root / "c_large.parquet")
    docs["c_large.parquet"] = ["large one", "large two"]
    invalid = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(np.array([0, 6, 12], np.int32).tobytes()),
                                                     pa.py_buffer(b"caf\xe9 !valid.")])  # Arrow does not check
    pq.write_table(pa.table({"text": invalid}), root / "d_latin1.parquet")
    docs["d_latin1.parquet"] = ["caf\ufffd !", "valid."]
    os.mkfifo(root / "e_fifo.jsonl")
    os.symlink("/dev/zero", root / "f_zero.txt")
    gz, docs["g_damaged.jsonl.gz"] = corrupt_gzip_lines()  # the lines before the damage are kept
    (root / "g_damaged.jsonl.gz").write_bytes(gz)
    (root / "h_plain.txt").write_text("A plain text document.\n")
    docs["h_plain.txt"] = ["A plain text document.\n"]
    (outside / "not_followed.txt").write_text("must not be read: behind a link to a directory")
    os.symlink(outside, root / "i_linked_dir")
    with open(os.path.join(os.fsencode(root), b"j_name_\xff.txt"), "w") as f:  # a non-UTF-8 file name
        f.write("A document whose file name is not UTF-8.")
    docs[os.fsdecode(b"j_name_\xff.txt")] = ["A document whose file name is not UTF-8."]
    os.mkfifo(outside / "direct.jsonl")
    return {"docs": docs, "direct": [str(outside / "direct.jsonl"), "/dev/zero"]}


def many_batches_corpus(root: Path, files: int = 16, file_bytes: int = 25_000) -> int:
    """Real text (standard-library sources) cut into documents of very different sizes (40 B to 5 KB),
    in JSONL and text files; returns the total text size."""
    import random
    import sysconfig

    rng = random.Random(0)
    source = "".join(p.read_text(encoding="utf-8", errors="replace")
                     for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40])
    root.mkdir(parents=True)
    pos = total = 0
    for i in range(files):
        docs, size = [], 0
        while size < file_bytes:
            n = rng.choice([40, 200, 1000, 5000])
            docs.append(source[pos:pos + n])
            pos, size = (pos + n) % (len(source) - 12000), size + n
        if i % 4 == 3:
            (root / f"f{i:02d}.txt").write_text("".join(docs))
        else:
            (root / f"f{i:02d}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        total += size
    return total
