"""Tokenization and loader throughput on the embedded corpus (the local CPython standard library).

    .venv/bin/python benchmarks/data_throughput.py            # about 1 minute on 2 cores

1. Tokenization MB/s with 1 and 2 workers against a plain single-process `encode_ordinary` loop over
   the same text held in memory (target >= 1.8 with 2 workers on 2 cores), measured two ways:
   the tokenization stage alone (rgpt-prep's worker pool and batch function on in-memory batches),
   and the whole rgpt-prep run (discover and hash inputs, read, tokenize, pack, write MDS shards,
   merge, manifest; interpreter start-up and imports excluded).
2. The streaming loader's samples/s (seq_len 1024, micro-batch 8) against the samples/s a training
   step consumes: a CPU forward+backward of recurrentgpt-debug measured here, and the rate an H200
   would need for GPT-2 small (~500k tokens/s, an assumption stated in the output).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

import torch

from data_prep.pipeline import BATCH_BYTES, PrepOptions, _init_worker, encode_batch, run
from data_prep.sources import stdlib_files
from rgpt_dist.config import load_config
from rgpt_dist.data.streaming import cleanup_stale_state, token_dataset, token_loader
from rgpt_dist.data.tokenizer import get_encoding
from rgpt_dist.registry import build_model

SEQ = 1024


def plain_loop(texts: list[str]) -> float:
    enc = get_encoding()
    t = time.perf_counter()
    for text in texts:
        enc.encode_ordinary(text)
    return time.perf_counter() - t


def stage(texts: list[str], workers: int) -> float:
    """The tokenization stage alone: rgpt-prep's batches through its encode function and pool."""
    batches, batch, size = [], [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= BATCH_BYTES:
            batches.append(batch)
            batch, size = [], 0
    batches.append(batch)
    if workers == 1:
        _init_worker(None)
        t = time.perf_counter()
        for b in batches:
            encode_batch(b, 0.005)
        return time.perf_counter() - t
    with mp.get_context("fork").Pool(workers, _init_worker, (None,)) as pool:
        pool.starmap(encode_batch, [(["warm-up"], 0.0)] * workers, chunksize=1)
        t = time.perf_counter()
        pool.starmap(encode_batch, [(b, 0.005) for b in batches], chunksize=1)
        return time.perf_counter() - t


def prep(out: Path, workers: int) -> float:
    t = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        code = run(PrepOptions(inputs=["python-stdlib"], out=out, seq_len=SEQ, workers=workers, progress=False))
    assert code == 0
    return time.perf_counter() - t


def loader_rate(root: Path, batch: int, n_batches: int) -> float:
    loader = token_loader(token_dataset(root, "train", batch_size=batch, shuffle=True), batch_size=batch)
    it = iter(loader)
    next(it)
    t = time.perf_counter()
    for _ in range(n_batches):
        next(it)
    return n_batches * batch / (time.perf_counter() - t)


def train_rate(batch: int) -> float:
    cfg = load_config("recurrentgpt-debug").model
    model = build_model(cfg, seed=0).train()
    x = torch.randint(0, cfg.vocab_size, (batch, SEQ))
    model(x, x, r=cfg.n_loops).loss.backward()
    t = time.perf_counter()
    for _ in range(3):
        model(x, x, r=cfg.n_loops).loss.backward()
    return 3 * batch / (time.perf_counter() - t)


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    texts = [p.read_bytes().decode("utf-8", errors="replace") for p in stdlib_files()]
    mb = sum(len(t.encode()) for t in texts) / 2**20
    with tempfile.TemporaryDirectory() as tmp:
        t_plain = plain_loop(texts)
        stages = {w: stage(texts, w) for w in (1, 2)}
        times = {w: prep(Path(tmp) / f"w{w}", w) for w in (1, 2)}
        print(f"corpus: python-stdlib, {len(texts)} files, {mb:.1f} MB, seq_len {SEQ}, {torch.get_num_threads()} threads")
        print(f"plain encode_ordinary loop:        {mb / t_plain:6.2f} MB/s")
        for w, t in stages.items():
            print(f"tokenization stage, {w} worker(s):  {mb / t:6.2f} MB/s  ratio to plain loop {t_plain / t:.2f}")
        for w, t in times.items():
            print(f"whole rgpt-prep run, {w} worker(s): {mb / t:6.2f} MB/s  ratio to plain loop {t_plain / t:.2f}")
        cleanup_stale_state()
        load = loader_rate(Path(tmp) / "w1", batch=8, n_batches=200)
        step = train_rate(batch=8)
        need_h200 = 500_000 / SEQ
        print(f"loader: {load:8.0f} samples/s (micro-batch 8, seq_len {SEQ}, 0 workers)")
        print(f"CPU training step (recurrentgpt-debug, fwd+bwd): {step:8.1f} samples/s -> loader/step {load / step:.0f}x")
        print(f"H200 GPT-2 small at ~500k tokens/s (assumed): {need_h200:8.0f} samples/s -> loader/need {load / need_h200:.1f}x")
        cleanup_stale_state()


if __name__ == "__main__":
    main()
