"""What every algorithmic task shares: seeds, vocabulary layout, the counter-based RNG, the split
partition and the held-out sets (RLT paper, section 3 and appendix J).

An example is a pure function of (task, split, split seed, index, length). Its random numbers come from
a Philox generator keyed by a hash of those integers (`make_rng`), so example i never depends on examples
0..i-1 and every process and rank produces the same bytes for the same key.

Splits never share an example where that is possible at all (the choice, in one place: `Task.accepts`):
every example has a canonical key (its token ids; for addition the unordered operand pair), and a
keyed hash of it assigns the example to one of 16 buckets: bucket 0 is validation, 1 is test, 2-15 are
training. At every length whose example space holds at least 2**20 items, a split only keeps draws of
its own bucket (a rejected draw is redrawn with the next `attempt` counter), so train, validation and
test are disjoint there. Below 2**20 items (parity under 20 bits, the smallest addition widths) nothing
can be held out without removing a measurable part of the training distribution, and the paper trains
on all such examples; the only held-out set that reaches such a length is the mixed 1-8-digit addition
validation set (the paper's own choice of a validation range equal to the training range). Validation
and test sets hold no duplicate (the paper's "unique" pairs, "exclude duplicates"): a held-out set is
the first N distinct accepted draws of its stream, built whole and cached per (task, split, seed, length).
"""
from __future__ import annotations

import functools
import hashlib
import struct
from dataclasses import dataclass

import numpy as np

# Data seeds (paper J.5): formal tasks train / validation / test; addition uses 42 for its training
# stream and validation set and the test seed for its test partition (J.6).
TRAIN_SEED, VAL_SEED, TEST_SEED = 20260914, 20260915, 20260916
ADDITION_TRAIN_SEED = 42
SPLIT_SEEDS = {"train": TRAIN_SEED, "val": VAL_SEED, "test": TEST_SEED}
# Model initialisation seeds (paper 3.1); recorded here for the trainer, never used to draw data.
MODEL_SEEDS = (42, 43, 44)
SPLITS = ("train", "val", "test")
VAL_SET_SIZE = 256            # per validation length (J.1.1)
TEST_SET_SIZE = 1024          # per formal-task test length (J.6)
VOCAB_CAPACITY = 277          # the models' embedding rows (J.3); every task's ids lie below it

# Every task's vocabulary starts with these three; targets at unscored positions are IGNORE_INDEX
# (torch.nn.functional.cross_entropy's default ignore_index).
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
IGNORE_INDEX = -100

PARTITION_BUCKETS = 16
_BUCKET_OF_SPLIT = {"val": 0, "test": 1}
PARTITION_MIN_LOG2 = 20.0     # partition only lengths whose example space holds >= 2**20 items
_MAX_ATTEMPTS = 2000          # (15/16)**2000 ~ 1e-56: a rejection loop never runs out in practice
_SPLIT_CODE = {"train": 1, "val": 2, "test": 3}


class TaskError(ValueError):
    """Bad input to a task generator: unknown task or split, a length outside the task's range, an
    empty length grid, an index outside a held-out set."""


@dataclass(frozen=True)
class Sample:
    """One drawn instance before padding: the full token sequence and how it is scored.

    tokens: [S] int64, the whole sequence the model reads (BOS first).
    targets: [S] int64, the id the model must output at each position, IGNORE_INDEX where unscored.
    key: canonical bytes identifying the instance (for the partition and de-duplication).
    """
    tokens: np.ndarray
    targets: np.ndarray
    key: bytes


@dataclass(frozen=True)
class Example:
    """A model-ready example. tokens, targets, mask: [T]; mask marks the positions the paper scores
    (targets[t] != IGNORE_INDEX exactly where mask[t]). length: the task length (bits, operations,
    expression tokens, operand width; for mixed-width addition the wider operand)."""
    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    length: int


def make_rng(*counter: int) -> np.random.Generator:
    """A Philox generator whose 128-bit key is a hash of the integers: counter-based, so any
    (task, split, seed, index, length, attempt) is drawn directly, with no state carried over."""
    digest = hashlib.blake2b(struct.pack(f"<{len(counter)}q", *counter), digest_size=16).digest()
    return np.random.Generator(np.random.Philox(key=int.from_bytes(digest, "little")))


def bucket_of(task_name: str, key: bytes) -> int:
    """The partition bucket of an instance: a keyed hash, identical in every process (not `hash`)."""
    digest = hashlib.blake2b(key, digest_size=8, person=task_name.encode()[:16]).digest()
    return int.from_bytes(digest, "little") % PARTITION_BUCKETS


def split_of_bucket(bucket: int) -> str:
    """Bucket 0 is validation, 1 is test, the other 14 are training."""
    for split, b in _BUCKET_OF_SPLIT.items():
        if b == bucket:
            return split
    return "train"


def _check_split(split) -> str:
    if split not in SPLITS:
        raise TaskError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")
    return split


def _check_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TaskError(f"{name} must be an integer, got {value!r}")
    return int(value)


class Task:
    """A task generator. Subclasses set `name`, `symbols`, `train_lengths`, `val_lengths`,
    `test_lengths`, `max_length` and implement `_sample(rng, length)` and `space_log2(length)`."""
    name: str = ""
    symbols: tuple[str, ...] = ()
    train_lengths: tuple[int, ...] = ()
    val_lengths: tuple = ()
    test_lengths: tuple[int, ...] = ()
    min_length: int = 1
    max_length: int = 1024
    code: int = 0                 # a fixed small integer per task, part of every RNG key
    test_set_size: int = TEST_SET_SIZE
    length_rule: str = ""         # what else a valid length must satisfy, for the error message

    @property
    def curriculum_lengths(self) -> tuple[int, ...]:
        """The lengths a cap below the grid's top (data.task_train_max) trains on, up to the cap: the
        training grid itself, unless a task says otherwise (S5's grid is the single length 32)."""
        return self.train_lengths

    @property
    def vocab(self) -> tuple[str, ...]:
        """The token strings; a token's id is its index."""
        return SPECIALS + self.symbols

    def token_id(self, symbol: str) -> int:
        return self.vocab.index(symbol)

    def seed(self, split: str) -> int:
        """The data seed of a split (paper J.5)."""
        return SPLIT_SEEDS[_check_split(split)]

    def lengths(self, split: str) -> tuple:
        """The split's length grid: every training length, or the held-out lengths."""
        grid = {"train": self.train_lengths, "val": self.val_lengths,
                "test": self.test_lengths}[_check_split(split)]
        if not grid:
            raise TaskError(f"task {self.name!r} has an empty {split} length grid")
        return tuple(grid)

    def set_size(self, split: str) -> int | None:
        """How many examples a held-out set holds per length (None: the training stream is unbounded)."""
        return {"train": None, "val": VAL_SET_SIZE, "test": self.test_set_size}[_check_split(split)]

    def check_length(self, length, split: str | None = None):
        """The length, or TaskError naming it when the task (or the split's grid) cannot produce it."""
        if length is None:
            if split is not None and None not in self.lengths(split) and split != "train":
                raise TaskError(f"task {self.name!r}: the {split} split needs a length, one of "
                                f"{self.lengths(split)}")
            return None
        length = _check_int("length", length)
        if not self.min_length <= length <= self.max_length or not self.valid_length(length):
            raise TaskError(f"task {self.name!r}: length {length} is outside its range "
                            f"{self.min_length}..{self.max_length}{self.length_rule}")
        if split is not None and length not in self.lengths(split):
            raise TaskError(f"task {self.name!r}: length {length} is not in its {split} grid "
                            f"{self.lengths(split)}")
        return length

    def valid_length(self, length: int) -> bool:
        return True

    def max_tokens(self, length=None) -> int:
        """The token count of the longest example the task can produce at `length` (None: the
        training mix, i.e. the longest over the training grid), BOS included; what seq_len must hold."""
        if length is None:
            return max(self._max_tokens(n) for n in self.train_lengths)
        return self._max_tokens(self.check_length(length))

    def max_tokens_of(self, split: str) -> int:
        """The longest example over a split's whole length grid (a grid entry None: the training mix)."""
        return max(self.max_tokens(n) for n in self.lengths(split))

    framing_tokens = 1            # tokens besides the `length` counted ones (BOS; mod-5 adds '=')

    def _max_tokens(self, length: int) -> int:
        return length + self.framing_tokens

    def partitioned(self, length) -> bool:
        """Whether the split partition applies at this length (its example space is large enough)."""
        return self.space_log2(length) >= PARTITION_MIN_LOG2

    def accepts(self, split: str, sample: Sample, length) -> bool:
        """The split-disjointness rule (module docstring): keep a draw only in its own bucket."""
        if not self.partitioned(length):
            return True
        return split_of_bucket(bucket_of(self.name, sample.key)) == split

    def draw(self, split: str, seed: int, index: int, length) -> Sample:
        """The index-th accepted draw of a split's stream at a length (None: the training mix)."""
        for attempt in range(_MAX_ATTEMPTS):
            rng = make_rng(self.code, _SPLIT_CODE[split], seed, index, length or 0, attempt)
            sample = self._sample(rng, length)
            if self.accepts(split, sample, self.sample_length(sample, length)):
                return sample
        raise RuntimeError(f"task {self.name!r}: no {split} example after {_MAX_ATTEMPTS} draws")

    def sample_length(self, sample: Sample, length):
        """The length the partition rule looks at (addition overrides it for its width mix)."""
        return length

    def example(self, split: str, index: int, length=None) -> Example:
        """Example `index` of a split: training draws directly; validation/test index a held-out set."""
        split = _check_split(split)
        index = _check_int("index", index)
        if not 0 <= index < 2**62:          # the RNG key packs it as a signed 64-bit integer
            raise TaskError(f"index must be in 0..2**62 - 1, got {index}")
        length = self.check_length(length, split)
        if split == "train":
            if length is None:
                length = self.draw_train_length(make_rng(self.code, 0, self.seed(split), index))
            sample = self.draw(split, self.seed(split), index, length)
        else:
            size = self.set_size(split)
            if index >= size:
                raise TaskError(f"index {index} is past the {split} set of {size} examples")
            sample = heldout_set(self, split, self.seed(split), length)[index]
        return self.finish(sample, length)

    def finish(self, sample: Sample, length) -> Example:
        mask = sample.targets != IGNORE_INDEX
        return Example(sample.tokens, sample.targets, mask, self.example_length(sample, length))

    def example_length(self, sample: Sample, length) -> int:
        return int(length)

    def draw_train_length(self, rng: np.random.Generator) -> int | None:
        """The training length distribution (the choice, in one place): uniform over the grid."""
        grid = self.train_lengths
        return int(grid[int(rng.integers(0, len(grid)))])

    def _sample(self, rng: np.random.Generator, length) -> Sample:
        raise NotImplementedError

    def space_log2(self, length) -> float:
        raise NotImplementedError


@functools.lru_cache(maxsize=64)
def heldout_set(task: Task, split: str, seed: int, length) -> tuple[Sample, ...]:
    """The first `set_size` distinct accepted draws of a held-out stream, built whole (de-duplication
    needs the earlier members) and cached; identical in every process."""
    size = task.set_size(split)
    seen: set[bytes] = set()
    out: list[Sample] = []
    j = 0
    while len(out) < size:
        if j >= 64 * size:
            raise TaskError(f"task {task.name!r}: length {length} has too few distinct {split} examples")
        sample = task.draw(split, seed, j, length)
        j += 1
        if sample.key not in seen:
            seen.add(sample.key)
            sample.tokens.flags.writeable = sample.targets.flags.writeable = False   # shared by callers
            out.append(sample)
    return tuple(out)
