"""Nested boolean logic (SPEC section 8; the authors' nested-expr/logic_experiment.py, read for the
definitions, not copied).

An example is `[CLS]` followed by a boolean expression, one token per character, over the authors'
vocabulary: <pad> 0, [CLS] 1, T 2, F 3, & 4, | 5, ! 6, ( 7, ) 8. The label is its value with the usual
precedence (! binds tightest, then &, then |, left to right); the classifier reads the CLS position;
rotary positions (`positions = "rope"`), the only positional signal (no additive embedding).

The expression at nesting depth d (the maximum parenthesis depth, exactly d by construction):
d = 0 is an atom: with probability 1/2 a constant T or F, 1/4 its negation !T or !F, 1/4 `a op b` of two
constants (unparenthesised, so precedence matters); d >= 1 is `(X op Y)` with op & or | uniform, one
child at depth d - 1, the other at a depth k in 0..d-1 drawn with weight 2**(d - 1 - k) (shallow
favoured; k = 0 when d = 1), the two children in random order, the whole prefixed by ! with
probability 1/4. Draws longer than max_len = 128 tokens (CLS included) are redrawn (the authors' cap;
it bites only at the deepest eval depths).

Deviation, for the per-bucket label-balance check: the authors keep each expression's natural value;
here example i redraws until its value is the label its index asks for (base.py), so every bucket is
exactly half true. Training depths 1-8, generator range 1-14; test buckets 500 examples (the authors').
Depth 1 has at most 576 distinct expressions, too few to split three ways: it is exempt from the
split partition (base.py); every deeper depth is partitioned.
"""
from __future__ import annotations

import numpy as np

from .base import ThinkingTask, sequence_example

VOCAB = ("<pad>", "[CLS]", "T", "F", "&", "|", "!", "(", ")")
_ID = {c: i for i, c in enumerate(VOCAB)}


def _atom(rng: np.random.Generator) -> str:
    r = rng.random()
    const = "TF"[int(rng.integers(2))]
    if r < 0.5:
        return const
    if r < 0.75:
        return "!" + const
    return const + "&|"[int(rng.integers(2))] + "TF"[int(rng.integers(2))]


def expression(rng: np.random.Generator, depth: int) -> str:
    """A random expression of nesting depth exactly `depth` (module docstring)."""
    if depth == 0:
        return _atom(rng)
    op = "&|"[int(rng.integers(2))]
    deep = expression(rng, depth - 1)
    if depth > 1:
        weights = 2.0 ** np.arange(depth - 1, -1, -1)          # k = 0..depth-1 -> 2**(depth-1-k)
        other_depth = int(rng.choice(depth, p=weights / weights.sum()))
    else:
        other_depth = 0
    other = expression(rng, other_depth)
    inner = deep + op + other if rng.random() < 0.5 else other + op + deep
    out = "(" + inner + ")"
    return "!" + out if rng.random() < 0.25 else out


def evaluate(expr: str) -> bool:
    """Recursive descent: or := and ('|' and)*, and := not ('&' not)*, not := '!' not | primary."""
    pos = 0

    def parse_or() -> bool:
        nonlocal pos
        value = parse_and()
        while pos < len(expr) and expr[pos] == "|":
            pos += 1
            value = parse_and() or value       # evaluate both sides: the parser must consume them
        return value

    def parse_and() -> bool:
        nonlocal pos
        value = parse_not()
        while pos < len(expr) and expr[pos] == "&":
            pos += 1
            value = parse_not() and value
        return value

    def parse_not() -> bool:
        nonlocal pos
        if expr[pos] == "!":
            pos += 1
            return not parse_not()
        if expr[pos] == "(":
            pos += 1
            value = parse_or()
            pos += 1                           # the matching ')'
            return value
        pos += 1
        return expr[pos - 1] == "T"

    value = parse_or()
    if pos != len(expr):
        raise ValueError(f"trailing input in {expr!r} at {pos}")
    return value


class NestedLogic(ThinkingTask):
    name = "logic"
    code = 102
    vocab = VOCAB
    readout_k = 1
    train_range = (1, 8)
    eval_range = (1, 14)
    eval_difficulties = (2, 4, 6, 8, 10, 12, 14)
    eval_steps = (1, 2, 4, 6, 8, 10, 12, 16, 20, 24)
    bucket_size = 500
    max_len = 128
    positions = "rope"

    def partitioned(self, difficulty: int) -> bool:
        return difficulty >= 2

    def _draw(self, rng: np.random.Generator, split: str, depth: int, label: int):
        expr = expression(rng, depth)
        if len(expr) + 1 > self.max_len or int(evaluate(expr)) != label:
            return None, b""
        return sequence_example([_ID["[CLS]"]] + [_ID[c] for c in expr], label, depth)
