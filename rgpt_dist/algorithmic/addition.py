"""Multi-digit addition with reversed digits (RLT paper, section 3.1, J.1.1, J.5, J.6).

Serialisation (the character layout of the paper's reference preprocessing, nanogptpro's
arithmetics-addition data, one token per character, least significant digit first):
    <bos> [ a_rev ] _ + _ [ b_rev ] _ =  _ [ c_rev ] <eos>          (_ is a space token)
    '-------------- prompt ----------'  '--- answer -----'
The model is teacher-forced: tokens = sequence[:-1], targets = sequence[1:], and the scored targets are
the answer: the space, the brackets, the digits of the sum and EOS (paper J.4: "digits, spaces,
brackets, and EOS", excluding prompt and padding).

Lengths are operand widths. Training and validation draw each operand's width uniformly from 1..8
(independently, as the reference does), `length=None` in this API; the validation set is one pooled
set of 256 (J.1.1). A given length means both operands have exactly that width, as the test sets do
(9, 10, 11, 12, 14, 16, 32 digits, 256 unique unordered pairs each, J.6). A width-w operand has no
leading zero for w > 1; width 1 is any digit 0-9. Seeds: 42 for the training stream and validation
set, 20260916 for the test partition (J.5, J.6).
"""
from __future__ import annotations

import math

import numpy as np

from .base import (ADDITION_TRAIN_SEED, BOS_ID, EOS_ID, IGNORE_INDEX, SPLIT_SEEDS, Sample, Task,
                   TaskError, _check_split)

ADDITION_SYMBOLS = tuple("0123456789") + ("[", "]", "+", "=", " ")
MAX_TRAIN_WIDTH = 8


def _operand(rng: np.random.Generator, width: int) -> list[int]:
    """Digits of a width-`width` number, least significant first; no leading zero unless width 1."""
    low = rng.integers(0, 10, size=width - 1).tolist()
    top = int(rng.integers(0 if width == 1 else 1, 10))
    return low + [top]


def add_reversed(a: list[int], b: list[int]) -> list[int]:
    """Digit-wise sum of two least-significant-first digit lists, carry included."""
    out, carry = [], 0
    for i in range(max(len(a), len(b))):
        s = (a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) + carry
        out.append(s % 10)
        carry = s // 10
    return out + [1] if carry else out


def _digits(ds: list[int]) -> str:
    return "".join(map(str, ds))


def _count(width: int) -> int:
    return 10 if width == 1 else 9 * 10 ** (width - 1)


class Addition(Task):
    name = "addition"
    code = 6
    symbols = ADDITION_SYMBOLS
    train_lengths = tuple(range(1, MAX_TRAIN_WIDTH + 1))
    val_lengths = (None,)                 # one pooled set over the training width mix
    test_lengths = (9, 10, 11, 12, 14, 16, 32)
    max_length = 256
    test_set_size = 256

    def seed(self, split: str) -> int:
        return ADDITION_TRAIN_SEED if _check_split(split) != "test" else SPLIT_SEEDS["test"]

    def check_length(self, length, split=None):
        if length is None and split == "test":
            raise TaskError(f"task 'addition': the test split needs a width, one of {self.test_lengths}")
        if length is not None and split == "val":
            raise TaskError(f"task 'addition': the validation set mixes widths 1..{MAX_TRAIN_WIDTH}; "
                            f"pass no length (got {length!r})")
        return super().check_length(length, None if split == "val" else split)

    def _max_tokens(self, length: int) -> int:
        # Both operands `length` wide: BOS + "[a] + [b] =" (2w + 9) + " [c]" (3 + a sum of up to
        # w + 1 digits); EOS is never read (tokens = sequence[:-1]).
        return 3 * length + 14

    def draw_train_length(self, rng: np.random.Generator):
        return None                       # widths are drawn per operand inside _sample

    def _sample(self, rng: np.random.Generator, length) -> Sample:
        if length is None:
            wa, wb = (int(w) for w in rng.integers(1, MAX_TRAIN_WIDTH + 1, size=2))
        else:
            wa = wb = length
        return self.encode(_operand(rng, wa), _operand(rng, wb))

    def encode(self, a: list[int], b: list[int]) -> Sample:
        """The teacher-forced sample of a + b, operands as least-significant-first digit lists."""
        prompt = f"[{_digits(a)}] + [{_digits(b)}] ="
        answer = f" [{_digits(add_reversed(a, b))}]"
        seq = [BOS_ID] + [self.token_id(c) for c in prompt + answer] + [EOS_ID]
        seq = np.asarray(seq, dtype=np.int64)                       # [S]
        tokens, targets = seq[:-1], seq[1:].copy()                  # [S - 1] each
        targets[: len(prompt)] = IGNORE_INDEX                       # targets of BOS .. last prompt char
        pair = sorted((int(_digits(a)[::-1]), int(_digits(b)[::-1])))
        return Sample(tokens, targets, f"{pair[0]}+{pair[1]}".encode())   # unordered pair

    def sample_length(self, sample: Sample, length):
        """The partition looks at the operand widths, read back from the sample."""
        text = "".join(self.vocab[t] for t in sample.tokens[1:].tolist())
        left, right = text.split("] + [", 1)
        return (len(left) - 1, len(right.split("]", 1)[0]))

    def space_log2(self, length) -> float:
        if length is None:
            return 0.0
        wa, wb = length if isinstance(length, tuple) else (length, length)
        return math.log2(_count(wa) * _count(wb)) - (1.0 if wa == wb else 0.0)

    def example_length(self, sample: Sample, length) -> int:
        return int(length) if length is not None else max(self.sample_length(sample, None))
