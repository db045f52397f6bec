"""What the three thinking tasks share: the example record, input checks, the counter-based RNG, the
split partition, label balance, evaluation buckets and batching (SPEC section 8; docs/thinking.md).

Determinism (as the algorithmic suite, rgpt_dist/algorithmic/base.py): an example is a pure function of
(task, split, index, difficulty). Its random numbers come from `make_rng(task.code, split code, split
seed, index, difficulty, attempt)` with the suite's `SPLIT_SEEDS`, so example i never depends on
examples 0..i-1 and every rank and process produces the same bytes. With difficulty None (the training
mix, in any split) the difficulty is drawn uniformly from `task.train_range` by `make_rng(task.code, 0,
split seed, index)`, a pure function of the index too; evaluation passes a difficulty explicitly.

Labels: example i wants label 1 when i is even and 0 when i is odd (each generator builds, or redraws
until it gets, an example of that label), so any 2m consecutive indices hold exactly m of each: an
evaluation bucket `bucket(task, split, d, n)` (indices 0..n-1, n even) is label-balanced and a constant
predictor scores exactly 0.5 on it. The authors balance the graph and relational sets the same way (half
positives, half negatives per set); their logic sets keep the expression's natural label (a deviation,
logic.py).

Splits never share an example where practical: an example's canonical key (its token ids, plus the
adjacency and the readout for the graph) goes through the suite's keyed hash `bucket_of` into 16
buckets (0 validation, 1 test, 2-15 training) and a split only keeps draws of its own bucket, redrawing
with the next `attempt` otherwise. A task exempts a difficulty whose example space is too small for that
(`task.partitioned(d)`: only logic depth 1, at most 576 distinct expressions), as the suite does below
2**20 items. No de-duplication inside a split (the authors draw with repetition; each index is drawn
directly, never built from a whole cached set).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rgpt_dist.algorithmic.base import SPLIT_SEEDS, SPLITS, bucket_of, make_rng, split_of_bucket

PAD_ID = 0                    # every task's vocabulary starts with the padding token (inputs.py)
MAX_ATTEMPTS = 4000           # redraws for the split bucket, the label and the length cap; never hit
                              # in practice: the worst acceptance per draw is about 1/80 (logic depth 14,
                              # test split: 1/16 bucket x 1/2 label x ~0.4 length cap);
                              # (1 - 1/80)**4000 ~ 1e-22
SPLIT_CODE = {"train": 1, "val": 2, "test": 3}


class ThinkingTaskError(ValueError):
    """Bad input to a thinking task: unknown task or split, a negative index, a difficulty outside the
    generator's range, a graph larger than the attention mask allows, an odd bucket size."""


@dataclass(frozen=True)
class ThinkingExample:
    """One unpadded example (numpy).

    tokens [T] int64: token ids, PAD_ID never inside (T <= task.max_len).
    label: 0 or 1.  difficulty: hops / nesting depth / chain length (graph negatives: module graph.py).
    readout [K] int64: the positions the classifier reads (graph: source, target; others: [0], CLS).
    roles [T] int64 | None: 1 source, 2 target, 0 elsewhere (graph only).
    attn_mask [T, T] bool | None: True where query i may attend key j (graph: edge j -> i, or i == j).
    edges [E, 2] int64 | None: the graph's edges (u, v) meaning u -> v, sorted (graph only; for checks,
    not read by the model).
    """
    tokens: np.ndarray
    label: int
    difficulty: int
    readout: np.ndarray
    roles: np.ndarray | None = None
    attn_mask: np.ndarray | None = None
    edges: np.ndarray | None = None


def check_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ThinkingTaskError(f"{name} must be an integer, got {value!r}")
    return int(value)


def check_split(split) -> str:
    if split not in SPLITS:
        raise ThinkingTaskError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")
    return split


def check_index(index) -> int:
    index = check_int("index", index)
    if not 0 <= index < 2**62:              # the RNG key packs it as a signed 64-bit integer
        raise ThinkingTaskError(f"index must be in 0..2**62 - 1, got {index}")
    return index


class ThinkingTask:
    """A task generator. Subclasses set the class attributes below and implement `_draw(rng, split,
    difficulty, label) -> (ThinkingExample | None, key bytes)` (None: reject this draw, e.g. over the
    length cap or of the wrong label)."""
    name: str = ""
    code: int = 0                  # a fixed integer per task, part of every RNG key
    vocab: tuple[str, ...] = ()    # token strings; a token's id is its index; vocab[0] is padding
    readout_k: int = 1             # K: positions read by the classifier head
    train_range: tuple[int, int] = (1, 1)   # inclusive difficulty range of the training mix
    eval_range: tuple[int, int] = (1, 1)    # inclusive range the generator accepts (contains train)
    eval_difficulties: tuple[int, ...] = ()  # the authors' test-bucket grid
    eval_steps: tuple[int, ...] = ()         # the authors' thinking-step grid at evaluation
    bucket_size: int = 500         # the authors' examples per evaluation bucket
    max_len: int = 1               # the longest example (tokens / nodes); attention tables' size
    positions: str = "none"        # "none" or "rope": the positional scheme the model must use

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def token_id(self, symbol: str) -> int:
        return self.vocab.index(symbol)

    def check_difficulty(self, difficulty) -> int:
        """The difficulty, or ThinkingTaskError naming it and the generator's range."""
        difficulty = check_int("difficulty", difficulty)
        lo, hi = self.eval_range
        if not lo <= difficulty <= hi:
            raise ThinkingTaskError(f"task {self.name!r}: difficulty {difficulty} is outside its range "
                                    f"{lo}..{hi}")
        return difficulty

    def partitioned(self, difficulty: int) -> bool:
        """Whether the split partition applies at this difficulty (module docstring)."""
        return True

    def train_difficulty(self, split: str, index: int) -> int:
        """The training mix: uniform over train_range, a pure function of (split, index)."""
        lo, hi = self.train_range
        rng = make_rng(self.code, 0, SPLIT_SEEDS[split], index)
        return int(rng.integers(lo, hi + 1))

    def example(self, split: str, index: int, difficulty=None) -> ThinkingExample:
        """Example `index` of a split at a difficulty (None: drawn from the training mix)."""
        split, index = check_split(split), check_index(index)
        if difficulty is None:
            difficulty = self.train_difficulty(split, index)
        difficulty = self.check_difficulty(difficulty)
        label = 1 - index % 2
        seed = SPLIT_SEEDS[split]
        for attempt in range(MAX_ATTEMPTS):
            rng = make_rng(self.code, SPLIT_CODE[split], seed, index, difficulty, attempt)
            example, key = self._draw(rng, split, difficulty, label)
            if example is None:
                continue
            if not self.partitioned(difficulty) or split_of_bucket(bucket_of(self.name, key)) == split:
                return example
        raise RuntimeError(f"task {self.name!r}: no {split} example at difficulty {difficulty} after "
                           f"{MAX_ATTEMPTS} draws")

    def _draw(self, rng: np.random.Generator, split: str, difficulty: int, label: int):
        raise NotImplementedError


def sequence_example(tokens: list[int], label: int, difficulty: int) -> tuple[ThinkingExample, bytes]:
    """A CLS-read sequence example (logic, relational) and its canonical key (the token ids)."""
    arr = np.asarray(tokens, dtype=np.int64)
    return ThinkingExample(arr, int(label), int(difficulty), np.zeros(1, dtype=np.int64)), arr.tobytes()


def bucket(task: ThinkingTask, split: str, difficulty, n: int | None = None) -> list[ThinkingExample]:
    """The n examples (indices 0..n-1) of an evaluation bucket at one difficulty: label-balanced (n/2
    of each label), so a constant predictor scores exactly 0.5. n None: the task's `bucket_size`."""
    check_split(split)
    difficulty = task.check_difficulty(difficulty)
    n = task.bucket_size if n is None else check_int("bucket size n", n)
    if n <= 0 or n % 2:
        raise ThinkingTaskError(f"bucket size n must be a positive even number (label balance), got {n}")
    return [task.example(split, i, difficulty) for i in range(n)]
