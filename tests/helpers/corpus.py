"""The frozen test corpus: `corpus.jsonl.gz`, the package's source at commit 4f48433 as rgpt-prep
reads a directory (one document per file, in its order), one JSON line per document, gzip.

Distributed tests compare runs at tolerances measured on their data; when that data was the live
`rgpt_dist/` tree, any edit of the package changed every run's tokens, and float32 drift measured on
one version could exceed a tolerance on the next (2 failures in CI of e94a384, a gradient norm
2.8e-5 off against 1e-5). Tokenized, this file gives the same shards byte for byte as that tree did.

Rebuild (only to change the corpus on purpose; every tolerance is then to be re-measured):
    git archive <commit> rgpt_dist | tar -x -C /tmp/snap
    python -m tests.helpers.corpus /tmp/snap/rgpt_dist tests/helpers/corpus.jsonl.gz
"""
from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path

CORPUS = Path(__file__).with_name("corpus.jsonl.gz")


def freeze(source: str, out: str) -> int:
    """Write `source`'s documents (as rgpt-prep reads them) to `out`; returns the document count."""
    from data_prep.readers import read_documents
    from data_prep.report import Report
    from data_prep.sources import discover

    report, raw, n = Report(echo=False), io.BytesIO(), 0
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as gz:  # mtime 0: reproducible bytes
        for f in discover([source], report):
            for text, _ in read_documents(f, "text", 64 << 20, report):
                gz.write((json.dumps({"text": text}, ensure_ascii=False) + "\n").encode())
                n += 1
    Path(out).write_bytes(raw.getvalue())
    return n


if __name__ == "__main__":
    print(freeze(sys.argv[1], sys.argv[2]), "documents")
