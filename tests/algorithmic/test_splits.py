"""The splits share no example: validation and test sets are disjoint from each other and from the
training stream wherever the example space allows a held-out part (rgpt_dist/algorithmic/base.py)."""
from __future__ import annotations

import numpy as np

from rgpt_dist.algorithmic import TASKS, get_task
from rgpt_dist.algorithmic.base import bucket_of, heldout_set, split_of_bucket


def _keys(samples):
    return [s.key for s in samples]


def test_every_heldout_length_is_partitioned():
    """The disjointness guarantee covers every validation and test length of every task (addition's
    pooled validation set excepted, which the paper draws from the training widths)."""
    for task in TASKS.values():
        for split in ("val", "test"):
            for length in task.lengths(split):
                if length is not None:
                    assert task.partitioned(length), (task.name, split, length)


def test_train_val_test_disjoint_where_collisions_are_likely():
    """At 20 bits (2**20 strings) 10,000 training draws would meet ~12 members of 1,280 held-out
    strings by chance (none with probability e**-12); the partition leaves none, and validation and
    test share none."""
    task = get_task("parity")
    val = set(_keys(heldout_set(task, "val", task.seed("val"), 20)))
    test = set(_keys(heldout_set(task, "test", task.seed("test"), 20)))
    train = {task.draw("train", task.seed("train"), i, 20).key for i in range(10000)}
    assert len(val) == 256 and len(test) == 1024
    assert not val & test and not train & val and not train & test


def test_shared_lengths_disjoint_and_unique():
    """Lengths that appear in two or three splits: no key in two of them, none twice within a set."""
    for name, length in (("parity", 32), ("s5_swaps", 32)):
        task = get_task(name)
        val = _keys(heldout_set(task, "val", task.seed("val"), length))
        test = _keys(heldout_set(task, "test", task.seed("test"), length))
        train = [task.draw("train", task.seed("train"), i, length).key for i in range(300)]
        assert len(set(val)) == 256 and len(set(test)) == 1024
        assert not set(val) & set(test) and not set(train) & (set(val) | set(test))
        assert {split_of_bucket(bucket_of(name, k)) for k in val} == {"val"}
        assert {split_of_bucket(bucket_of(name, k)) for k in test} == {"test"}
        assert {split_of_bucket(bucket_of(name, k)) for k in train} == {"train"}


def test_addition_pairs_unique_unordered_and_disjoint():
    task = get_task("addition")
    test9 = _keys(heldout_set(task, "test", task.seed("test"), 9))
    assert len(set(test9)) == 256                      # unique unordered pairs (J.6)
    assert all(split_of_bucket(bucket_of("addition", k)) == "test" for k in test9)
    val = _keys(heldout_set(task, "val", task.seed("val"), None))
    assert len(set(val)) == 256
    # a pair and its swap are one key: the test set never holds both orders
    a, b = [3, 2, 1] + [1] * 6, [9, 8, 9] + [1] * 6
    assert task.encode(a, b).key == task.encode(b, a).key


def test_heldout_sets_identical_for_every_model_seed():
    """A held-out set depends on the task, split and length only: no model seed enters it."""
    task = get_task("s5_swaps")
    first = [task.example("val", i, 32).tokens for i in (0, 100, 255)]
    heldout_set.cache_clear()
    again = [task.example("val", i, 32).tokens for i in (255, 100, 0)][::-1]
    assert all(np.array_equal(x, y) for x, y in zip(first, again))
    assert not first[0].flags.writeable          # the cached set cannot be changed through an example
