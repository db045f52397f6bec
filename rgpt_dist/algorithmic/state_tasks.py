"""Parity and S5 permutation tracking (RLT paper, section 3.1 and J.1.1).

Serialisation (tagging: the model reads the inputs and is scored at its own positions, no '='):
  parity:  <bos> b1 b2 ... bn            target at b_n's position: the parity bit ("0"/"1")
  S5:      <bos> g1 g2 ... gn            target at g_t's position: the running product after g_t
Lengths count inputs (bits, operations) and exclude BOS (paper J.6).

Choices where the paper is silent (each kept in one place):
  - parity's label sits at the last bit, not after an '=' (the paper's "any final equals sign" names
    one only for the expressions); training lengths are uniform over 3..40 (`Task.draw_train_length`);
  - a permutation token is its one-line notation ("20134" maps 0->2, 1->0, ...); ids follow the
    lexicographic order of itertools.permutations, so the identity is the first permutation token;
  - composition order (`compose`): the state after input t is g_t o state_{t-1}, i.e. the new input is
    applied after the product so far: state_t(k) = g_t(state_{t-1}(k)), state_0 = identity;
  - swaps inputs are uniform over the identity and the ten transpositions (i j), i < j (Grazzi et al.
    2024); standard inputs are uniform over all 120 permutations.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from .base import BOS_ID, IGNORE_INDEX, SPECIALS, Sample, Task

PERMUTATIONS: tuple[tuple[int, ...], ...] = tuple(itertools.permutations(range(5)))
PERM_INDEX = {p: i for i, p in enumerate(PERMUTATIONS)}
PERM_SYMBOLS = tuple("".join(map(str, p)) for p in PERMUTATIONS)


def compose(after: tuple[int, ...], before: tuple[int, ...]) -> tuple[int, ...]:
    """after o before: apply `before` first, then `after` (the running product's order)."""
    return tuple(after[before[k]] for k in range(5))


# COMPOSE[g, s] = index of g o s; the scan below reads it 120 x 120 times cheaper than composing.
COMPOSE = np.array([[PERM_INDEX[compose(g, s)] for s in PERMUTATIONS] for g in PERMUTATIONS],
                   dtype=np.int64)


def _transposition(i: int, j: int) -> tuple[int, ...]:
    p = list(range(5))
    p[i], p[j] = p[j], p[i]
    return tuple(p)


SWAP_GENERATORS = (PERM_INDEX[tuple(range(5))],) + tuple(
    PERM_INDEX[_transposition(i, j)] for i, j in itertools.combinations(range(5), 2))


def running_products(inputs: np.ndarray) -> np.ndarray:
    """[n] permutation indices -> [n] indices of g_t o ... o g_1 (the state after each input).

    A Hillis-Steele scan: after the pass with `shift`, entry i holds the product of the inputs
    (i - 2 * shift, i], later factors on the left; log2(n) vectorised passes instead of n steps."""
    out = np.asarray(inputs, dtype=np.int64).copy()
    shift = 1
    while shift < len(out):
        out[shift:] = COMPOSE[out[shift:], out[:-shift]]      # right side is read before the write
        shift *= 2
    return out


def _key(tokens: np.ndarray) -> bytes:
    return tokens.astype("<u2").tobytes()


class Parity(Task):
    """Final parity of a bit string, 3-40 training bits."""
    name = "parity"
    code = 1
    symbols = ("0", "1")
    train_lengths = tuple(range(3, 41))
    val_lengths = (32, 36, 40)
    test_lengths = (32, 40, 48, 64, 96, 128, 192, 256)
    max_length = 4096

    def _sample(self, rng: np.random.Generator, length) -> Sample:
        return self.encode(rng.integers(0, 2, size=length))

    def encode(self, bits: np.ndarray) -> Sample:
        """[n] 0/1 bits -> the sample: BOS, the bits, the parity as the last bit's target."""
        length = len(bits)
        tokens = np.concatenate([[BOS_ID], bits + len(SPECIALS)]).astype(np.int64)   # [n + 1]
        targets = np.full(length + 1, IGNORE_INDEX, dtype=np.int64)
        targets[-1] = len(SPECIALS) + int(bits.sum() % 2)
        return Sample(tokens, targets, _key(tokens))

    def space_log2(self, length) -> float:
        return float(length)


class S5(Task):
    """S5 state tracking: the running product after every input, 32 training operations."""
    symbols = PERM_SYMBOLS
    train_lengths = (32,)
    val_lengths = (32,)
    test_lengths = (32, 48, 64, 96, 128, 192, 256, 512)
    max_length = 4096
    generators: tuple[int, ...] = tuple(range(120))
    # a capped S5 (a length curriculum, a CPU-scale reduction) trains on 1..cap operations, uniform; at
    # the cap 32 it is the paper's fixed 32 again. Every prefix is scored, so a word of n operations
    # holds the targets a shorter one would: the cap moves compute, not the task.
    curriculum_lengths = tuple(range(1, 33))

    def _sample(self, rng: np.random.Generator, length) -> Sample:
        gens = np.asarray(self.generators, dtype=np.int64)
        return self.encode(gens[rng.integers(0, len(gens), size=length)])

    def encode(self, inputs: np.ndarray) -> Sample:
        """[n] permutation indices -> the sample: BOS, the inputs, the running product at each."""
        offset = len(SPECIALS)
        tokens = np.concatenate([[BOS_ID], inputs + offset]).astype(np.int64)        # [n + 1]
        targets = np.concatenate([[IGNORE_INDEX], running_products(inputs) + offset])
        return Sample(tokens, targets.astype(np.int64), _key(tokens))

    def space_log2(self, length) -> float:
        return length * math.log2(len(self.generators))


class S5Standard(S5):
    name = "s5_standard"
    code = 2


class S5Swaps(S5):
    name = "s5_swaps"
    code = 3
    generators = SWAP_GENERATORS
