"""Small corpora written into a temp dir for the data_prep tests."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

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
