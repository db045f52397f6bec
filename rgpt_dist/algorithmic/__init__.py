"""The algorithmic length-generalisation tasks of the RLT paper (section 3, appendix J): parity, S5
permutation tracking (standard and swaps), mod-5 arithmetic (flat and bracketed) and reversed-digit
addition. No torch, no torch.distributed: examples are numpy arrays, pure functions of
(task, split seed, index, length), identical on every rank.

    task = get_task("parity")
    task.vocab                          # token strings; id = index; every id < VOCAB_CAPACITY (277)
    task.lengths("train" | "val" | "test")
    task.example("train", 17)           # length drawn from the training distribution
    task.example("test", 3, 256)        # the 4th of the 1,024 shared test sequences at 256 bits
    make_batch(task, "train", range(0, 32))   # Batch(tokens, targets, mask, lengths), [B, T]

docs/algorithmic.md describes the serialisation and the choices made where the paper is silent.
"""
from __future__ import annotations

from .addition import Addition
from .base import (BOS_ID, EOS_ID, IGNORE_INDEX, MODEL_SEEDS, PAD_ID, SPLIT_SEEDS, SPLITS,
                   TEST_SEED, TEST_SET_SIZE, TRAIN_SEED, VAL_SEED, VAL_SET_SIZE, VOCAB_CAPACITY,
                   Example, Task, TaskError)
from .batch import Batch, heldout_batches, make_batch, pad_examples
from .mod5 import Mod5Brackets, Mod5Flat
from .state_tasks import Parity, S5Standard, S5Swaps

TASKS: dict[str, Task] = {t.name: t for t in (Parity(), S5Standard(), S5Swaps(), Mod5Flat(),
                                              Mod5Brackets(), Addition())}


def get_task(name) -> Task:
    """The task called `name`; TaskError naming it and the known tasks otherwise."""
    if not isinstance(name, str) or name not in TASKS:
        raise TaskError(f"unknown task {name!r}: expected one of {', '.join(sorted(TASKS))}")
    return TASKS[name]


def validation_problem(task: str, dp: int) -> list[str]:
    """Why the task's validation set cannot be split evenly over dp ranks ([] when it can)."""
    t = get_task(task)
    n = len(t.lengths("val")) * t.set_size("val")
    if n % dp:
        return [f"the {n} validation examples of data.task={t.name!r} ({len(t.lengths('val'))} lengths x "
                f"{t.set_size('val')}) do not split evenly over {dp} data-parallel ranks"]
    return []


__all__ = ["TASKS", "get_task", "validation_problem", "Task", "TaskError", "Example", "Batch", "make_batch",
           "pad_examples", "heldout_batches", "BOS_ID", "EOS_ID", "PAD_ID", "IGNORE_INDEX",
           "MODEL_SEEDS", "SPLIT_SEEDS", "SPLITS", "TRAIN_SEED", "VAL_SEED", "TEST_SEED",
           "VAL_SET_SIZE", "TEST_SET_SIZE", "VOCAB_CAPACITY"]
