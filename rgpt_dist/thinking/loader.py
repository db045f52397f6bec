"""The torch side of the thinking tasks for the project's trainer: training micro-batches and
validation batches as (ThinkingInputs, labels) pairs (rgpt_dist/thinking/inputs.py; the trainer moves
both with `.to(device)` and calls the model with them, as it does a language model's (x, y)).

Training: global example `i` of a run is `task.example("train", i)`, its difficulty drawn from the
task's training range by the index. Indexing is the algorithmic suite's (rgpt_dist/algorithmic/loader.py):
step s, micro-batch m of dp rank d reads examples s * G + (m * dp + d) * B ... + B - 1, so dp ranks
together read one process's global batch and `state_dict()` (step, micro) resumes exactly. Every batch
is padded to the task's max_len: one shape for the whole run.

Validation: VAL_PER_DIFFICULTY examples of the validation split at every training difficulty
(label-balanced per difficulty: tasks/base.py), pooled in difficulty order, cut into dp equal parts,
each rank's part in batches of equal size (the largest divisor <= micro_batch_size), so the trainer's
mean of batch means and then of rank means is the mean over the whole set.
"""
from __future__ import annotations

from typing import Any

import torch

from rgpt_dist.algorithmic.loader import TaskLoader, rank_batches
from rgpt_dist.thinking.inputs import ThinkingInputs, collate, make_batch
from rgpt_dist.thinking.tasks import VAL_PER_DIFFICULTY, get_task, validation_problem

"""Validation examples per training difficulty (even: label-balanced)."""

Batch = tuple[ThinkingInputs, torch.Tensor]


class ThinkingLoader(TaskLoader):
    """An endless stream of one data-parallel rank's training micro-batches of a thinking task: the
    algorithmic loader's indexing and iteration (`indices`, `__iter__`) over this task's batches."""

    def __init__(self, task: str, micro_batch_size: int, global_batch_size: int, dp: int, dp_rank: int):
        self.task = get_task(task)
        if global_batch_size % (micro_batch_size * dp):
            raise ValueError(f"train.global_batch_size={global_batch_size} is not a multiple of "
                             f"train.micro_batch_size={micro_batch_size} x {dp} data-parallel ranks")
        if not 0 <= dp_rank < dp:
            raise ValueError(f"data-parallel rank {dp_rank} is outside 0..{dp - 1}")
        self.seq_len = self.task.max_len  # the trainer counts tokens (positions) with it
        self.micro_batch_size, self.global_batch_size = micro_batch_size, global_batch_size
        self.dp, self.dp_rank = dp, dp_rank
        self.accum = global_batch_size // (micro_batch_size * dp)
        self.step, self.micro = 0, 0  # the next micro-batch to read

    def batch(self, step: int, micro: int) -> Batch:
        x = make_batch(self.task, "train", self.indices(step, micro), None, self.seq_len)
        return x, x.labels

    def state_dict(self) -> dict[str, Any]:
        return {"task": self.task.name, "suite": "thinking", "step": self.step, "micro": self.micro,
                "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at a saved position; refuses another task's state or another global batch."""
        if not isinstance(state, dict) or state.get("task") != self.task.name or state.get("suite") != "thinking":
            got = state.get("task") if isinstance(state, dict) else None
            raise ValueError(f"the checkpoint's data position is not one of data.task={self.task.name!r} "
                             f"(it records task {got!r}): resume with the data it was trained on")
        self._resume_position(state)


def validation_batches(task: str, micro_batch_size: int, dp: int, dp_rank: int) -> list[Batch]:
    """This rank's part of the validation set (module docstring)."""
    t = get_task(task)
    problem = validation_problem(task, dp)
    if problem:
        raise ValueError(problem[0])
    lo, hi = t.train_range
    pool = [(d, i) for d in range(lo, hi + 1) for i in range(VAL_PER_DIFFICULTY)]
    out = []
    for chunk in rank_batches(pool, micro_batch_size, dp, dp_rank):
        x = collate(t, (t.example("val", i, d) for d, i in chunk), t.max_len)
        out.append((x, x.labels))
    return out
