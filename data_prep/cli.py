"""Tokenize raw text with GPT-2 BPE into mosaicml-streaming shards of seq_len + 1 token samples.

    rgpt-prep python-stdlib --out data/stdlib --seq-len 256                # the embedded default corpus
    rgpt-prep corpus/*.jsonl.zst --text-field content --out data/web --workers 8
    rgpt-prep shards/ 'more/**/*.parquet' --out data/mix --val-fraction 0.01 --overwrite
    rgpt-prep --fetch-vocab                                                # get the GPT-2 vocabulary offline

Inputs are files, directories (walked; recognised extensions only) and globs of plain text (one
document per file), JSONL (one document per line, field --text-field) and Parquet (column
--text-field, read in record batches); text and JSONL may be .gz or .zst compressed. The word
`python-stdlib` names the local CPython standard library sources. Problems in the input are
reported with file and line, counted in OUT/manifest.json, and never stop the run; the exit code is
1 only when no valid document was read, 2 for usage errors or an existing output without --overwrite.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from data_prep.pipeline import PrepOptions, run
from rgpt_dist.data.tokenizer import VocabularyUnavailable, fetch_vocab


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rgpt-prep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="*", help="files, directories, globs, or python-stdlib")
    p.add_argument("--out", type=Path, help="output dataset directory (created; must not exist or be empty)")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per training sequence; samples hold seq_len + 1 (default 1024)")
    p.add_argument("--val-fraction", type=float, default=0.005, help="fraction of documents in the validation split, by content hash (default 0.005)")
    p.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text (default text)")
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes (default 1); output is identical for any value")
    p.add_argument("--max-doc-mb", type=float, default=16.0, help="skip (and report) documents larger than this (default 16)")
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
            (args.part_mb <= 0, f"--part-mb={args.part_mb} must be > 0"),
            (args.shard_mb <= 0, f"--shard-mb={args.shard_mb} must be > 0")) if bad]
        if problems:
            p.error("; ".join(problems))
        opts = PrepOptions(inputs=args.inputs, out=args.out, seq_len=args.seq_len, val_fraction=args.val_fraction,
                           text_field=args.text_field, max_doc_mb=args.max_doc_mb, part_mb=args.part_mb,
                           shard_mb=args.shard_mb, compression=args.compression, vocab=args.vocab,
                           workers=args.workers, overwrite=args.overwrite, resume=args.resume, progress=args.progress)
        return run(opts)
    except VocabularyUnavailable as e:
        print(f"rgpt-prep: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
