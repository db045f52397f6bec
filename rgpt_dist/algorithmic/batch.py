"""Fixed-length padded batches of task examples, with the loss mask the paper scores.

tokens [B, T] (PAD_ID after each example), targets [B, T] (IGNORE_INDEX where unscored, so they can go
straight to cross_entropy), mask [B, T] bool (parity and mod-5: the final label; S5: every input
position; addition: the answer tokens and EOS), lengths [B] (each example's task length).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .base import IGNORE_INDEX, PAD_ID, Example, Task, TaskError


@dataclass(frozen=True)
class Batch:
    tokens: np.ndarray    # [B, T] int64
    targets: np.ndarray   # [B, T] int64
    mask: np.ndarray      # [B, T] bool
    lengths: np.ndarray   # [B] int64


def pad_examples(examples: Sequence[Example], seq_len: int | None = None) -> Batch:
    """Stacks examples into [B, T] arrays, T = seq_len or the longest example."""
    if not examples:
        raise TaskError("cannot build a batch of no examples")
    longest = max(len(e.tokens) for e in examples)
    if seq_len is None:
        seq_len = longest
    elif isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < longest:
        raise TaskError(f"seq_len {seq_len!r} is shorter than the longest example ({longest} tokens)")
    b = len(examples)
    tokens = np.full((b, seq_len), PAD_ID, dtype=np.int64)
    targets = np.full((b, seq_len), IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros((b, seq_len), dtype=bool)
    for i, e in enumerate(examples):
        n = len(e.tokens)
        tokens[i, :n], targets[i, :n], mask[i, :n] = e.tokens, e.targets, e.mask
    lengths = np.asarray([e.length for e in examples], dtype=np.int64)
    return Batch(tokens, targets, mask, lengths)


def make_batch(task: Task, split: str, indices: Sequence[int], length=None,
               seq_len: int | None = None) -> Batch:
    """Examples `indices` of a split at one length (None: the training mix), padded to seq_len.

    For a training step the caller picks the indices, e.g. step * global_batch + rank's offset, so
    every rank draws its own slice of one global stream without generating the others.
    """
    return pad_examples([task.example(split, int(i), length) for i in indices], seq_len)


def heldout_batches(task: Task, split: str, length, batch_size: int, seq_len: int | None = None):
    """Yields the whole held-out set of one length in order, batch_size examples at a time."""
    size = task.set_size(split)
    if size is None:
        raise TaskError("the training split has no finite set to iterate; use make_batch")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise TaskError(f"batch_size must be a positive integer, got {batch_size!r}")
    for start in range(0, size, batch_size):
        yield make_batch(task, split, range(start, min(size, start + batch_size)), length, seq_len)
