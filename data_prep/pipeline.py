"""rgpt-prep's pipeline: documents -> GPT-2 tokens (+ <|endoftext|>) -> packed samples of seq_len + 1
tokens -> MDS shards per split, with a manifest.

Layout of OUT (built in OUT.partial, swapped into place only when complete; see output.py):
    OUT/train/index.json, OUT/train/part-NNNNN/shard.*.mds     (same for val)
    OUT/manifest.json
Inputs are grouped into parts of about `part_mb` of input bytes; a part is packed independently and
becomes durable (OUT.partial/parts/part-NNNNN.json, written once its shards are fsynced), so an
interrupted run resumes at the first incomplete part. The final partial sample of each part and
split is dropped and its tokens are counted as the remainder. Output depends only on the inputs and the
options that shape it, never on the worker count.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import multiprocessing as mp
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from tqdm import tqdm

from data_prep.output import (FORMAT, OutputError, check_out, lock_out, prepare_staging, publish,
                              release_out, seal_part, staging_dir, write_json)
from data_prep.readers import read_documents
from data_prep.report import Report
from data_prep.sources import InputFile, discover
from rgpt_dist.data.mds import mds_writer, merge_split_index
from rgpt_dist.data.tokenizer import EOT_TOKEN, GPT2_VOCAB_SHA256, find_vocab, get_encoding

SPLITS = ("train", "val")
BATCH_BYTES = 1 << 20  # documents are tokenized in batches of about 1 MiB of text


@dataclasses.dataclass
class PrepOptions:
    """Everything that shapes a dataset (plus how to run: workers, overwrite, resume, progress)."""

    inputs: list[str]
    out: Path
    seq_len: int = 1024
    val_fraction: float = 0.005
    text_field: str = "text"
    max_doc_mb: float = 16.0
    max_row_group_mb: float = 1024.0
    part_mb: float = 256.0
    shard_mb: float = 64.0
    compression: str | None = None
    vocab: str | None = None
    workers: int = 1
    overwrite: bool = False
    resume: bool = True
    progress: bool = True

    def shaping(self) -> dict[str, Any]:
        """The options the dataset's bytes depend on (the resume fingerprint and the manifest)."""
        return {k: getattr(self, k) for k in ("seq_len", "val_fraction", "text_field", "max_doc_mb",
                                              "max_row_group_mb", "part_mb", "shard_mb", "compression")}


def is_val(text: str, fraction: float) -> bool:
    """Deterministic split by document content: identical documents always land in the same split."""
    h = int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
    return h < fraction * 2**64


_ENC = None


def _init_worker(vocab: str | None) -> None:
    global _ENC
    _ENC = get_encoding(vocab)


def encode_batch(texts: list[str], fraction: float) -> list[tuple[np.ndarray, bool]]:
    """Tokens of each document with <|endoftext|> appended (uint16), and whether it goes to val."""
    out = []
    for text in texts:
        ids = _ENC.encode_to_numpy(text, disallowed_special=())  # = encode_ordinary, as an array
        tokens = np.empty(len(ids) + 1, dtype=np.uint16)
        tokens[:-1] = ids
        tokens[-1] = EOT_TOKEN
        out.append((tokens, is_val(text, fraction)))
    return out


class Packer:
    """Cuts a stream of token arrays into samples of exactly n tokens; keeps the rest."""

    def __init__(self, n: int):
        self.n, self.buf, self.count = n, [], 0

    def add(self, tokens: np.ndarray) -> Iterator[np.ndarray]:
        self.buf.append(tokens)
        self.count += len(tokens)
        if self.count >= self.n:
            flat = np.concatenate(self.buf)
            k = len(flat) // self.n
            yield from flat[: k * self.n].reshape(k, self.n)
            self.buf, self.count = [flat[k * self.n:]], len(flat) - k * self.n


def plan_parts(files: list[InputFile], part_bytes: float) -> list[list[InputFile]]:
    parts, current, size = [], [], 0
    for f in files:
        current.append(f)
        size += f.size
        if size >= part_bytes:
            parts.append(current)
            current, size = [], 0
    return parts + ([current] if current else [])


def _batches(files: list[InputFile], opts: PrepOptions, report: Report) -> Iterator[tuple[list[int], list[str]]]:
    """(file index of each document, documents) in about BATCH_BYTES of text; batches span files,
    so corpora of many small files still make few large tasks."""
    owners, texts, size = [], [], 0
    for i, f in enumerate(files):
        for text, _line in read_documents(f, opts.text_field, int(opts.max_doc_mb * 2**20), report,
                                          int(opts.max_row_group_mb * 2**20)):
            owners.append(i)
            texts.append(text)
            size += len(text)
            if size >= BATCH_BYTES:
                yield owners, texts
                owners, texts, size = [], [], 0
    if texts:
        yield owners, texts


def _tokenized(files: list[InputFile], opts: PrepOptions, report: Report, pool) -> Iterator[tuple[list[int], int, list]]:
    """(file index per document, characters, encoded batch) in input order, at most 2 batches per
    worker in flight."""
    jobs = _batches(files, opts, report)
    if pool is None:
        for owners, texts in jobs:
            yield owners, sum(map(len, texts)), encode_batch(texts, opts.val_fraction)
        return
    pending: collections.deque = collections.deque()
    for owners, texts in jobs:
        pending.append((owners, sum(map(len, texts)), pool.apply_async(encode_batch, (texts, opts.val_fraction))))
        if len(pending) >= 2 * opts.workers:
            owners, chars, res = pending.popleft()
            yield owners, chars, res.get()
    while pending:
        owners, chars, res = pending.popleft()
        yield owners, chars, res.get()


def write_part(index: int, files: list[InputFile], opts: PrepOptions, staging: Path, pool, progress,
               report: Report) -> dict:
    """Tokenize and pack one part into staging/<split>/part-NNNNN; return its record (with the
    part's own `report` of skipped items)."""
    name = f"part-{index:05d}"
    n = opts.seq_len + 1
    writers = {s: mds_writer(staging / s / name, n, opts.shard_mb, opts.compression) for s in SPLITS}
    packers = {s: Packer(n) for s in SPLITS}
    per_file = [{s: {"documents": 0, "tokens": 0} for s in SPLITS} for _ in files]
    samples = dict.fromkeys(SPLITS, 0)
    for owners, chars, encoded in _tokenized(files, opts, report, pool):
        for i, (tokens, val) in zip(owners, encoded):
            split = "val" if val else "train"
            per_file[i][split]["documents"] += 1
            per_file[i][split]["tokens"] += len(tokens)
            for sample in packers[split].add(tokens):
                writers[split].write({"tokens": sample})
                samples[split] += 1
        progress(sum(len(t) for t, _ in encoded), len(encoded), chars)
    for w in writers.values():
        w.finish()
    seal_part(staging, SPLITS, name)
    return {"part": name, "files": [f.path for f in files], "per_file": per_file, "samples": samples,
            "remainder_tokens": {s: packers[s].count for s in SPLITS}, **report.to_dict()}


class _Progress:
    """Documents, MB of text and tokens/s on stderr (tqdm), or nothing."""

    def __init__(self, enabled: bool):
        self.bar, self.tokens, self.docs, self.t0 = None, 0, 0, time.perf_counter()
        if enabled:
            self.bar = tqdm(unit="MB", desc="rgpt-prep", file=sys.stderr,
                            bar_format="{desc}: {n:.1f} MB of text [{elapsed}] {postfix}")

    def __call__(self, tokens: int, docs: int, nbytes: int) -> None:
        self.tokens += tokens
        self.docs += docs
        if self.bar is not None:
            rate = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
            self.bar.set_postfix_str(f"{self.docs} docs, {rate / 1e6:.2f}M tokens/s", refresh=False)
            self.bar.update(nbytes / 2**20)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _fingerprint(files: list[InputFile], opts: PrepOptions) -> str:
    plan = {"format": FORMAT, "vocab": GPT2_VOCAB_SHA256, "options": opts.shaping(),
            "files": [(f.path, f.sha256) for f in files]}
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


def _manifest(files: list[InputFile], parts: list[dict], opts: PrepOptions, report: Report) -> dict:
    per_file = [pf for p in parts for pf in p["per_file"]]
    splits = {}
    for s in SPLITS:
        samples = sum(p["samples"][s] for p in parts)
        splits[s] = {"documents": sum(pf[s]["documents"] for pf in per_file),
                     "tokens": sum(pf[s]["tokens"] for pf in per_file),
                     "samples": samples, "tokens_in_samples": samples * (opts.seq_len + 1),
                     "remainder_tokens": sum(p["remainder_tokens"][s] for p in parts)}
    inputs = [{"path": f.path, "sha256": f.sha256, "bytes": f.size, "format": f.fmt,
               "compression": f.compression, **pf} for f, pf in zip(files, per_file)]
    return {"format": FORMAT,
            "tokenizer": {"name": "gpt2", "encoding": "tiktoken r50k_base", "n_vocab": 50257,
                          "eot_token": EOT_TOKEN, "vocab_sha256": GPT2_VOCAB_SHA256},
            "seq_len": opts.seq_len, "sample_tokens": opts.seq_len + 1, "dtype": "uint16",
            "options": opts.shaping(),
            "split_rule": "val when blake2b-64(document UTF-8) < val_fraction * 2^64",
            "document_separator": "<|endoftext|> (50256) appended after every document",
            "remainder_policy": "each part's final partial sample per split is dropped; its tokens are "
                                "counted in remainder_tokens (tokens = tokens_in_samples + remainder_tokens)",
            "invalid_utf8_policy": "invalid bytes replaced by U+FFFD; the document is kept and a warning recorded; "
                                   "a JSON string with a lone surrogate escape is skipped",
            "splits": splits, "inputs": inputs,
            "parts": [{"part": p["part"], "files": len(p["files"]), "samples": p["samples"]} for p in parts],
            **report.to_dict()}


def run(opts: PrepOptions) -> int:
    """Build the dataset; return the exit code (0 ok, 1 nothing to write, 2 usage or output error)."""
    out = Path(opts.out)
    try:
        check_out(out, opts.overwrite)
        lock = lock_out(out)  # one run per OUT, until this one ends
    except OutputError as e:
        print(f"rgpt-prep: {e}", file=sys.stderr)
        return 2
    try:
        return _run_locked(opts, out)
    finally:
        release_out(out, lock)


def _run_locked(opts: PrepOptions, out: Path) -> int:
    try:
        check_out(out, opts.overwrite)  # again: a run that held the lock may have just published OUT
    except OutputError as e:
        print(f"rgpt-prep: {e}", file=sys.stderr)
        return 2
    if find_vocab(opts.vocab) is None:
        get_encoding(opts.vocab)  # fail fast, with instructions, before any worker starts
    # Workers load the vocabulary while this process discovers and hashes the inputs.
    pool = mp.get_context("fork").Pool(opts.workers, _init_worker, (opts.vocab,)) if opts.workers > 1 else None
    if pool is None:
        _init_worker(opts.vocab)
    report, progress, staging = Report(), _Progress(opts.progress), staging_dir(out)
    try:
        files = discover(opts.inputs, report)
        prepare_staging(staging, _fingerprint(files, opts), opts.resume)
        parts = _write_parts(files, opts, staging, pool, progress, report)
    except OutputError as e:
        print(f"rgpt-prep: {e}", file=sys.stderr)
        return 2
    finally:
        progress.close()
        if pool is not None:
            pool.terminate()
    return _finish(files, parts, opts, staging, out, report)


def _write_parts(files: list[InputFile], opts: PrepOptions, staging: Path, pool, progress,
                 report: Report) -> list[dict]:
    """Every part's record: read back when a previous attempt completed it, else written now."""
    parts = []
    for i, part_files in enumerate(plan_parts(files, opts.part_mb * 2**20)):
        record_file = staging / "parts" / f"part-{i:05d}.json"
        if record_file.exists():
            record = json.loads(record_file.read_text())
        else:
            for s in SPLITS:  # leftovers of the interrupted attempt at this part
                shutil.rmtree(staging / s / f"part-{i:05d}", ignore_errors=True)
            part_report = Report(echo=report.echo, echoed=report.echoed)
            record = write_part(i, part_files, opts, staging, pool, progress, part_report)
            report.echoed = part_report.echoed
            write_json(record_file, record)
        report.merge(record)
        parts.append(record)
    return parts


def _nothing_to_write(manifest: dict, opts: PrepOptions) -> str | None:
    """Why the run produced no dataset (exit 1), or None."""
    docs = sum(manifest["splits"][s]["documents"] for s in SPLITS)
    tokens = sum(manifest["splits"][s]["tokens"] for s in SPLITS)
    if not docs:
        return "no valid document was read"
    if not any(manifest["splits"][s]["samples"] for s in SPLITS):
        return (f"{docs} documents, {tokens} tokens: fewer than one sample of seq_len+1 = {opts.seq_len + 1} "
                f"tokens in any split of any part (each part's final partial sample is dropped); add text "
                f"or lower --seq-len")
    return None


def _finish(files: list[InputFile], parts: list[dict], opts: PrepOptions, staging: Path, out: Path,
            report: Report) -> int:
    """Index, manifest, publish; or, when there is nothing to publish, remove the staging directory
    (rgpt-prep's own: check_out proved it) and exit 1 with the reason."""
    manifest = _manifest(files, parts, opts, report)
    why = _nothing_to_write(manifest, opts)
    if why is not None:
        print(f"rgpt-prep: {why}; nothing written", file=sys.stderr)
        shutil.rmtree(staging)
        return 1
    for s in SPLITS:
        merge_split_index(staging / s, [p["part"] for p in parts])
        manifest["splits"][s]["shards"] = sorted(str(p.relative_to(staging)) for p in (staging / s).rglob("*.mds*"))
        if not manifest["splits"][s]["samples"]:
            print(f"rgpt-prep: warning: the {s} split has no complete sample (raise the corpus size or "
                  f"--val-fraction, or lower --seq-len)", file=sys.stderr)
    write_json(staging / "manifest.json", manifest)
    publish(staging, out)
    _summary(manifest, out)
    return 0


def _summary(manifest: dict, out: Path) -> None:
    for s in SPLITS:
        m = manifest["splits"][s]
        print(f"{s}: {m['documents']} documents, {m['tokens']} tokens, {m['samples']} samples "
              f"({m['remainder_tokens']} remainder tokens dropped)", file=sys.stderr)
    skipped = manifest["skipped"]["counts"]
    if skipped:
        print("skipped: " + ", ".join(f"{k}: {v}" for k, v in skipped.items()), file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
