"""Tokenize raw text with GPT-2 BPE into mosaicml-streaming shards of seq_len + 1 token samples.

    rgpt-prep python-stdlib --out data/stdlib --seq-len 256                # the embedded default corpus
    rgpt-prep corpus/*.jsonl.zst --text-field content --out data/web --workers 8
    rgpt-prep shards/ 'more/**/*.parquet' --out data/mix --val-fraction 0.01 --overwrite
    rgpt-prep --fetch-vocab                                                # get the GPT-2 vocabulary offline
    S3_ENDPOINT_URL=http://minio:9000 rgpt-prep corpus/ --out s3://bucket/web   # built locally, uploaded

Inputs are files, directories (walked; recognised extensions only; links to directories inside them
not followed) and globs (`**` does not descend into links to directories either: a link to its own
parent would make it endless) of plain text (one document per file), JSONL (one document per line,
field --text-field) and Parquet (column --text-field: string, large_string, string_view or
dictionary-encoded strings; read a row group at a time, in record batches); text and JSONL may be
.gz or .zst compressed.
The word `python-stdlib` names the local CPython standard library sources.

Contract. A problem in the input never stops the run: it is reported on stderr as `file:line: reason`
(`file: reason` when it concerns a whole file; the first 20 are printed) and counted by reason in
OUT/manifest.json (`skipped`, or `warnings` for kept input). Skipped, and counted: inputs that do not
exist, globs matching nothing, duplicates (same path or same content), unsupported names, anything
that is not a regular file (FIFO, socket, device, also through a link: never opened), unreadable
files and directories, empty and binary files; JSONL lines that are malformed, nested too deeply or
otherwise unparseable, not objects, without the field or with a non-string or empty one, or holding
a lone surrogate escape (`"\\ud800"`); documents or lines over --max-doc-mb (a long line is skipped
while it streams past, never held in memory); Parquet files without the column or with a non-string
one, null values, row groups whose text column decompresses to more than --max-row-group-mb (by the
file's metadata: skipped unread); compressed files that turn out corrupt (the documents before the
damage are kept). Invalid UTF-8 is repaired (U+FFFD) and counted as a warning.

Exit codes: 0 the dataset was written; 1 nothing to write: no valid document was read, or the valid
ones make less than one sample of seq_len + 1 tokens (the reason is printed, nothing is left behind);
2 usage errors: bad options, no input, a missing vocabulary, an --out that is '.', '..', '/', a file,
a link or under a file, an existing non-empty OUT without --overwrite or (with it) one that is not an
rgpt-prep dataset, and an existing OUT.partial (or .OUT.old) that rgpt-prep did not make: rgpt-prep
never deletes a directory it cannot prove it created, and names it instead; and another rgpt-prep run
writing the same OUT (it holds the lock file .OUT.lock beside OUT, which the message names). With a
remote --out (data_prep/remote.py), also: a URI with credentials or a query in it, a bucket or
endpoint that does not answer, a prefix that already holds a dataset without --overwrite, and an
upload that failed (the file and the endpoint named; the local build kept).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from data_prep.output import is_dataset
from data_prep.pipeline import PrepOptions, run
from data_prep.remote import RemoteOutputError, check_remote_out, local_build_dir, upload
from rgpt_dist.data.uri import is_remote
from rgpt_dist.data.tokenizer import VocabularyUnavailable, fetch_vocab


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rgpt-prep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="*", help="files, directories, globs, or python-stdlib")
    p.add_argument("--out", help="output dataset directory (created; must not exist or be empty, or be an rgpt-prep "
                   "dataset replaced with --overwrite), or s3://BUCKET/PREFIX (built locally, then uploaded; "
                   "endpoint from S3_ENDPOINT_URL, credentials from the AWS environment)")
    p.add_argument("--local", default=None, help="with a remote --out: build here and keep it (default: a private "
                   "cache directory, removed after the upload)")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per training sequence; samples hold seq_len + 1 (default 1024)")
    p.add_argument("--val-fraction", type=float, default=0.005, help="fraction of documents in the validation split, by content hash (default 0.005)")
    p.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text (default text)")
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes (default 1); output is identical for any value")
    p.add_argument("--max-doc-mb", type=float, default=16.0, help="skip (and report) documents larger than this (default 16)")
    p.add_argument("--max-row-group-mb", type=float, default=1024.0,
                   help="skip (and report), unread, Parquet row groups whose text column decompresses to more than "
                        "this (default 1024; bounds memory: a few kB of zstd can expand to gigabytes)")
    p.add_argument("--part-mb", type=float, default=256.0, help="input MB per resumable part (default 256)")
    p.add_argument("--shard-mb", type=float, default=64.0, help="MDS shard size limit in MB (default 64)")
    p.add_argument("--compression", default=None, help="MDS shard compression, e.g. zstd (default none)")
    p.add_argument("--vocab", default=None, help="path to gpt2.tiktoken (else RGPT_GPT2_VOCAB, the cache, tiktoken)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory (only once the new one is complete)")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the completed parts of an interrupted run with the same inputs and options (default on)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty(),
                   help="progress bar on stderr (default: when stderr is a terminal)")
    p.add_argument("--fetch-vocab", action="store_true", help="download gpt2.tiktoken (openai-whisper sdist from PyPI) into the cache, then continue")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    try:
        if args.fetch_vocab:
            print(f"vocabulary: {fetch_vocab()}", file=sys.stderr)
            if not args.inputs:
                return 0
        if not args.inputs or args.out is None:
            p.error("give at least one input and --out")
        problems = [msg for bad, msg in (
            (args.seq_len < 1, f"--seq-len={args.seq_len} must be >= 1"),
            (args.seq_len + 1 > 65536, f"--seq-len={args.seq_len} too large"),
            (not 0 <= args.val_fraction < 1, f"--val-fraction={args.val_fraction} must be in [0, 1)"),
            (args.workers < 1, f"--workers={args.workers} must be >= 1"),
            (args.max_doc_mb <= 0, f"--max-doc-mb={args.max_doc_mb} must be > 0"),
            (args.max_row_group_mb <= 0, f"--max-row-group-mb={args.max_row_group_mb} must be > 0"),
            (args.part_mb <= 0, f"--part-mb={args.part_mb} must be > 0"),
            (args.shard_mb <= 0, f"--shard-mb={args.shard_mb} must be > 0")) if bad]
        if problems:
            p.error("; ".join(problems))
        remote = args.out if is_remote(args.out) else None
        if args.local and not remote:
            p.error(f"--local is where a remote --out is built; --out {args.out} is local")
        out = local_build_dir(remote, args.local) if remote else Path(args.out)
        if remote:
            check_remote_out(remote, args.overwrite)
        opts = PrepOptions(inputs=args.inputs, out=out, seq_len=args.seq_len, val_fraction=args.val_fraction,
                           text_field=args.text_field, max_doc_mb=args.max_doc_mb,
                           max_row_group_mb=args.max_row_group_mb, part_mb=args.part_mb,
                           shard_mb=args.shard_mb, compression=args.compression, vocab=args.vocab,
                           workers=args.workers,  # the private build directory is ours to replace; a --local one is not
                           overwrite=args.overwrite or bool(remote and not args.local and is_dataset(out)),
                           resume=args.resume, progress=args.progress)
        status = run(opts)
        if status == 0 and remote:
            upload(out, remote, remove_local=args.local is None)
        return status
    except (VocabularyUnavailable, RemoteOutputError) as e:
        print(f"rgpt-prep: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
