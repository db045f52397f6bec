"""Modular arithmetic mod 5, flat and bracketed (RLT paper, section 3.1 and J.1.1, J.6).

Serialisation:  <bos> e1 e2 ... eL =     target at '=': the value mod 5 ("0".."4")
The length L counts expression tokens and excludes BOS and '=' (paper J.6), so a flat example of
length L has L + 2 tokens. '*' stands for the paper's multiplication sign.

Flat: operands 0-4 alternate with binary operators, so L is odd (training 3..39, validation 33, 35,
39, test 31, 39, ..., 255: the paper's actual odd lengths L - 1 of its even grid). Operands and
operators are uniform; the value respects precedence ('*' before '+'/'-', left to right).

Bracketed (the generator is our choice; the paper says only "expression trees" of token lengths 3..40
and tests even lengths): a length-exact random descent of the grammar
    expr   := term | expr ('+'|'-') term
    term   := factor | term '*' factor
    factor := digit | '(' expr ')' | '-' factor
Binary operators and brackets alone give only odd token lengths, so unary minus is the one addition
that reaches the paper's even lengths (32, 36, 40, 64, ...). Because the derivation follows the
precedence grammar, the tree's value is the value of the written string. Branch probabilities are in
BRACKET_PROBS; split points are uniform. Bracketed lengths stop at 512 (the descent is recursive,
about 1.5 frames per token).
"""
from __future__ import annotations

import math

import numpy as np

from .base import BOS_ID, IGNORE_INDEX, SPECIALS, Sample, Task

DIGITS = ("0", "1", "2", "3", "4")
MOD5_SYMBOLS = DIGITS + ("+", "-", "*", "(", ")", "=")
# (P(expr splits at a '+'/'-'), P(term splits at a '*'), P(a factor >= 3 tokens is a negation)).
# Measured at length 40 (1,500 draws): 30% digits, 29% brackets, mean bracket depth 2.8, labels
# 0-4 at 23/19/19/19/19%; (0.5, 0.5, 0.2) gave 36% brackets and 34% zeros (products with 0).
BRACKET_PROBS = (0.8, 0.5, 0.1)
_FLAT_OPS = ("+", "-", "*")


def flat_value(operands: list[int], ops: list[str]) -> int:
    """Value mod 5 of o0 op1 o1 op2 ... with '*' before '+'/'-'."""
    total, sign, term = 0, 1, operands[0]
    for op, x in zip(ops, operands[1:]):
        if op == "*":
            term = term * x % 5
        else:
            total = (total + sign * term) % 5
            sign, term = (1 if op == "+" else -1), x
    return (total + sign * term) % 5


class _Mod5(Task):
    symbols = MOD5_SYMBOLS
    framing_tokens = 2            # BOS and '='

    def _encode(self, symbols: list[str], value: int) -> Sample:
        ids = [self.token_id(s) for s in symbols]
        tokens = np.asarray([BOS_ID] + ids + [self.token_id("=")], dtype=np.int64)  # [L + 2]
        targets = np.full(len(tokens), IGNORE_INDEX, dtype=np.int64)
        targets[-1] = len(SPECIALS) + value
        return Sample(tokens, targets, tokens.astype("<u2").tobytes())


class Mod5Flat(_Mod5):
    """Flat expressions with precedence; odd lengths."""
    name = "mod5_flat"
    code = 4
    train_lengths = tuple(range(3, 40, 2))
    val_lengths = (33, 35, 39)
    test_lengths = (31, 39, 47, 63, 95, 127, 191, 255)
    max_length = 4095
    length_rule = " and odd (operands alternate with binary operators)"

    def valid_length(self, length: int) -> bool:
        return length % 2 == 1

    def _sample(self, rng: np.random.Generator, length) -> Sample:
        n = (length + 1) // 2
        operands = rng.integers(0, 5, size=n).tolist()                 # [n]
        ops = [_FLAT_OPS[k] for k in rng.integers(0, 3, size=n - 1).tolist()]   # [n - 1]
        symbols = [DIGITS[operands[0]]]
        for op, x in zip(ops, operands[1:]):
            symbols += [op, DIGITS[x]]
        return self._encode(symbols, flat_value(operands, ops))

    def space_log2(self, length) -> float:
        n = (length + 1) // 2
        return n * math.log2(5) + (n - 1) * math.log2(3)


class _Descent:
    """One length-exact random derivation of the bracket grammar; each method returns (symbols, value)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def _split(self, length: int) -> int:
        return int(self.rng.integers(1, length - 1))               # left part: 1 .. length - 2

    def expr(self, length: int):
        if length >= 3 and self.rng.random() < BRACKET_PROBS[0]:
            a = self._split(length)
            left, lv = self.expr(a)
            op = "+" if self.rng.random() < 0.5 else "-"
            right, rv = self.term(length - 1 - a)
            return left + [op] + right, (lv + rv if op == "+" else lv - rv) % 5
        return self.term(length)

    def term(self, length: int):
        if length >= 3 and self.rng.random() < BRACKET_PROBS[1]:
            a = self._split(length)
            left, lv = self.term(a)
            right, rv = self.factor(length - 1 - a)
            return left + ["*"] + right, lv * rv % 5
        return self.factor(length)

    def factor(self, length: int):
        if length == 1:
            d = int(self.rng.integers(0, 5))
            return [DIGITS[d]], d
        if length == 2 or self.rng.random() < BRACKET_PROBS[2]:
            inner, v = self.factor(length - 1)
            return ["-"] + inner, -v % 5
        inner, v = self.expr(length - 2)
        return ["("] + inner + [")"], v


class Mod5Brackets(_Mod5):
    """Bracketed expressions with unary minus, any length 1..512 (training 3..40)."""
    name = "mod5_brackets"
    code = 5
    train_lengths = tuple(range(3, 41))
    val_lengths = (32, 36, 40)
    test_lengths = (32, 40, 48, 64, 96, 128, 192, 256)
    max_length = 512

    def _sample(self, rng: np.random.Generator, length) -> Sample:
        symbols, value = _Descent(rng).expr(length)
        return self._encode(symbols, value)

    def space_log2(self, length) -> float:
        # Lower bound: every flat expression of odd length (prefixed by '-' when the length is even)
        # is a bracketed one.
        return Mod5Flat.space_log2(self, length if length % 2 else length - 1)
