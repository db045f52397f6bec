"""The torch side of the algorithmic tasks (rgpt_dist.algorithmic stays numpy-only): training
micro-batches and validation batches in the trainer's (x, y) format.

Training: global example `i` of a run is `task.example("train", i)` (a pure function of i, so nothing
is shuffled or stored). Optimizer step s reads examples s * G .. s * G + G - 1 (G = global batch);
micro-batch m of data-parallel rank d reads the micro_batch_size examples from
    s * G + (m * dp + d) * micro_batch_size,
so the dp ranks' micro-batches of one step together are one process's global batch, whatever dp is,
and the tensor-parallel ranks of one replica (same dp rank) read the same examples. The position is
(step, micro): `state_dict()` is all the trainer stores to resume exactly.

Tensors: x [B, seq_len] int64 token ids (PAD_ID after each example), y [B, seq_len] int64 targets,
the generators' IGNORE_INDEX (-100) mapped to the models' ignore value -1 (unscored positions:
prompt, padding).

Validation: the task's whole validation set, every validation length (256 examples each) pooled in
grid order, cut into dp equal contiguous parts, each rank's part in batches of equal size (the
largest divisor of the part that is <= micro_batch_size): the trainer averages batch means and then
rank means, which is then the mean over the whole set.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch

from rgpt_dist.algorithmic import IGNORE_INDEX, get_task, make_batch, pad_examples, validation_problem
from rgpt_dist.algorithmic.capped import capped

MODEL_IGNORE = -1  # the targets the layer factories' cross-entropy ignores


def _tensors(tokens: np.ndarray, targets: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    y = np.where(targets == IGNORE_INDEX, MODEL_IGNORE, targets)
    return torch.from_numpy(np.ascontiguousarray(tokens)), torch.from_numpy(np.ascontiguousarray(y))


class TaskLoader:
    """An endless stream of one data-parallel rank's training micro-batches of an algorithmic task."""

    def __init__(self, task: str, seq_len: int, micro_batch_size: int, global_batch_size: int,
                 dp: int, dp_rank: int, train_max: int = 0):
        self.task = capped(get_task(task), train_max)  # train_max: data.task_train_max (0: the whole grid)
        if global_batch_size % (micro_batch_size * dp):
            raise ValueError(f"train.global_batch_size={global_batch_size} is not a multiple of "
                             f"train.micro_batch_size={micro_batch_size} x {dp} data-parallel ranks")
        if not 0 <= dp_rank < dp:
            raise ValueError(f"data-parallel rank {dp_rank} is outside 0..{dp - 1}")
        # a capped stream pads to its own longest example (causal models: the scored positions' outputs
        # do not depend on padding after them, so only the compute changes)
        self.seq_len = min(seq_len, self.task.max_tokens()) if train_max else seq_len
        self.micro_batch_size, self.global_batch_size = micro_batch_size, global_batch_size
        self.dp, self.dp_rank = dp, dp_rank
        self.accum = global_batch_size // (micro_batch_size * dp)
        self.step, self.micro = 0, 0  # the next micro-batch to read

    def indices(self, step: int, micro: int) -> range:
        """Global example indices of this rank's micro-batch `micro` of optimizer step `step`."""
        start = step * self.global_batch_size + (micro * self.dp + self.dp_rank) * self.micro_batch_size
        return range(start, start + self.micro_batch_size)

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        b = make_batch(self.task, "train", self.indices(step, micro), None, self.seq_len)
        return _tensors(b.tokens, b.targets)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            out = self.batch(self.step, self.micro)
            self.micro += 1
            if self.micro == self.accum:
                self.step, self.micro = self.step + 1, 0
            yield out

    def state_dict(self) -> dict[str, Any]:
        return {"task": self.task.name, "train_lengths": list(self.task.train_lengths), "step": self.step,
                "micro": self.micro,
                "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at a saved position; refuses a state of another task, another global batch (the
        example indices would shift) or another kind of loader."""
        if not isinstance(state, dict) or state.get("task") != self.task.name:
            got = state.get("task") if isinstance(state, dict) else None
            raise ValueError(f"the checkpoint's data position is not one of data.task={self.task.name!r} "
                             f"(it records task {got!r}): resume with the data it was trained on")
        saved = state.get("train_lengths", list(get_task(self.task.name).train_lengths))  # older: the whole grid
        if saved != list(self.task.train_lengths):
            raise ValueError(f"the checkpoint trained on lengths {saved} of task {self.task.name!r}, "
                             f"this run on {list(self.task.train_lengths)} (data.task_train_max): the example "
                             f"stream would not continue")
        self._resume_position(state)

    def _resume_position(self, state: dict[str, Any]) -> None:
        """Continue at the saved (step, micro) of a state of this task: the same global batch (the
        example indices would shift otherwise), a micro-batch inside a step."""
        if state["global_batch_size"] != self.global_batch_size:
            raise ValueError(f"the checkpoint was trained with train.global_batch_size={state['global_batch_size']}, "
                             f"this run has {self.global_batch_size}: the example stream would not continue")
        if not 0 <= state["micro"] < self.accum:  # checkpoints are taken between steps (micro 0)
            raise ValueError(f"cannot resume at micro-batch {state['micro']} of a step of {self.accum}")
        self.step, self.micro = int(state["step"]), int(state["micro"])


def validation_batches(task: str, seq_len: int, micro_batch_size: int, dp: int,
                       dp_rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's part of the whole validation set (module docstring), as (x, y) batches."""
    t = get_task(task)
    problem = validation_problem(task, dp)
    if problem:
        raise ValueError(problem[0])
    pool = [(length, i) for length in t.lengths("val") for i in range(t.set_size("val"))]
    out = []
    for chunk in rank_batches(pool, micro_batch_size, dp, dp_rank):
        b = pad_examples([t.example("val", i, length) for length, i in chunk], seq_len)
        out.append(_tensors(b.tokens, b.targets))
    return out


def rank_batches(pool: list, micro_batch_size: int, dp: int, dp_rank: int) -> list[list]:
    """Rank dp_rank's contiguous part of `pool` (len(pool) divisible by dp), in batches of one size: the
    largest divisor of the part that is <= micro_batch_size, so that the mean of batch means, then of
    rank means, is the mean over the whole pool."""
    part = len(pool) // dp
    mine = pool[dp_rank * part:(dp_rank + 1) * part]
    size = max(d for d in range(1, min(micro_batch_size, part) + 1) if part % d == 0)
    return [mine[start:start + size] for start in range(0, part, size)]
