"""Bad input ends in TaskError (a ValueError) whose message names the offending value."""
from __future__ import annotations

import pytest

from rgpt_dist.algorithmic import Task, TaskError, get_task, heldout_batches, make_batch, pad_examples


@pytest.mark.parametrize("name", ["parityy", "", None, "S5"])
def test_unknown_task(name):
    with pytest.raises(TaskError, match=f"unknown task {name!r}"):
        get_task(name)


@pytest.mark.parametrize("name,split,length,needle", [
    ("parity", "train", 0, "length 0 is outside"),
    ("parity", "train", 41, "length 41 is not in its train grid"),
    ("parity", "test", 4097, "length 4097 is outside"),
    ("parity", "test", 36, "length 36 is not in its test grid"),
    ("parity", "val", None, "needs a length"),
    ("mod5_flat", "train", 4, "length 4 is outside its range 1..4095 and odd"),
    ("mod5_brackets", "test", 513, "length 513 is outside"),
    ("s5_swaps", "train", 31, "length 31 is not in its train grid"),
    ("addition", "test", None, "needs a width"),
    ("addition", "val", 5, "got 5"),
    ("addition", "train", 9, "length 9 is not in its train grid"),
    ("parity", "train", 3.0, "must be an integer, got 3.0"),
    ("parity", "train", True, "must be an integer, got True"),
])
def test_lengths_outside_range(name, split, length, needle):
    with pytest.raises(TaskError, match=needle):
        get_task(name).example(split, 0, length)


def test_bad_split_index_and_batch():
    task = get_task("parity")
    with pytest.raises(TaskError, match="unknown split 'validation'"):
        task.example("validation", 0, 32)
    with pytest.raises(TaskError, match="index 256 is past the val set of 256"):
        task.example("val", 256, 32)
    for bad in (-1, 2**62):
        with pytest.raises(TaskError, match=f"index must be in 0..2\\*\\*62 - 1, got {bad}"):
            task.example("train", bad)
    with pytest.raises(TaskError, match="index must be an integer, got '3'"):
        task.example("train", "3")
    with pytest.raises(TaskError, match="no examples"):
        make_batch(task, "train", [])
    with pytest.raises(TaskError, match="seq_len 10 is shorter than the longest example"):
        pad_examples([task.example("train", 0, 40)], seq_len=10)
    with pytest.raises(TaskError, match="batch_size must be a positive integer, got 0"):
        next(heldout_batches(task, "val", 32, 0))


def test_empty_length_grid():
    class NoTest(Task):
        name = "no_test"
        train_lengths = (3,)
    with pytest.raises(TaskError, match="empty test length grid"):
        NoTest().lengths("test")
    with pytest.raises(TaskError, match="empty test length grid"):
        NoTest().example("test", 0, 3)


def test_errors_are_value_errors():
    assert issubclass(TaskError, ValueError)
