"""The torch side of the algorithmic tasks (rgpt_dist.algorithmic stays numpy-only): training
micro-batches and validation batches in the trainer's (x, y) format.

Training: global example `i` of a run is `task.example("train", i)` (a pure function of i, so nothing
is shuffled or stored). Optimizer step s reads examples s * G .. s * G + G - 1 (G = global batch);
micro-batch m of data-parallel rank d reads the micro_batch_size examples from
    s * G + (m * dp + d) * micro_batch_size,
so the dp ranks' micro-batches of one step together are one process's global batch, whatever dp is,
and the tensor-parallel ranks of one replica (same dp rank) read the same examples. The position is
(step, micro): `state_dict()` is all the trainer stores to resume exactly.

Length buckets (data.task_sort_by_length): every rank builds the step's whole global batch, sorts it
by token count (stable: index order among equals) and takes part j = micro * dp + dp_rank of
micro_batch_size examples, padded to its own longest. The step's examples are the same; ranks at the
same micro-batch get neighbouring lengths (their steps take about as long). Under the example-mean
loss the equal-sized parts' mean is the step's mean, so a causal model whose forward does not depend
on its micro-batch's slot or width gets the padded step's gradients up to rounding (data.task_sort_by_length
says which do not). `widths(step)` gives the trainer the step's padded widths, for tokens and FLOPs.

A length curriculum (data.task_grow_*; `Growth`): the stream starts capped at data.task_train_max and
widens after enough steps in a row with a low training loss, which the trainer reports after each
step (`observe`, the same mean on every rank, so every rank widens at the same step). The cap and the
count of low steps are part of the state; the batches from the widening on are those of a stream
capped there from the start (example i depends on i and the cap only).

Tensors: x [B, seq_len] int64 token ids (PAD_ID after each example), y [B, seq_len] int64 targets,
the generators' IGNORE_INDEX (-100) mapped to the models' ignore value -1 (unscored positions:
prompt, padding).

Validation: the task's whole validation set, every validation length (256 examples each) pooled in
grid order, cut into dp equal contiguous parts, each rank's part in batches of equal size (the
largest divisor of the part that is <= micro_batch_size): the trainer averages batch means and then
rank means, which is then the mean over the whole set.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np
import torch

from rgpt_dist.algorithmic import IGNORE_INDEX, get_task, make_batch, pad_examples, validation_problem
from rgpt_dist.algorithmic.capped import capped

MODEL_IGNORE = -1  # the targets the layer factories' cross-entropy ignores


@dataclasses.dataclass(frozen=True)
class Growth:
    """A length curriculum (data.task_grow_*): `steps` steps in a row with a training loss below
    `loss` widen the training cap by `by` lengths."""
    by: int
    loss: float
    steps: int


def to_tensors(tokens: np.ndarray, targets: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded batch's arrays as the trainer's (x, y): IGNORE_INDEX targets become MODEL_IGNORE."""
    y = np.where(targets == IGNORE_INDEX, MODEL_IGNORE, targets)
    return torch.from_numpy(np.ascontiguousarray(tokens)), torch.from_numpy(np.ascontiguousarray(y))


class TaskLoader:
    """An endless stream of one data-parallel rank's training micro-batches of an algorithmic task."""

    sort_by_length = False  # length buckets (module docstring); a subclass without them inherits `widths`

    def __init__(self, task: str, seq_len: int, micro_batch_size: int, global_batch_size: int,
                 dp: int, dp_rank: int, train_max: int = 0, grow: Growth | None = None,
                 sort_by_length: bool = False):
        self.base, self.seq_len_max, self.sort_by_length = get_task(task), seq_len, sort_by_length
        self._sorted: tuple[tuple[int, int], list] | None = None  # ((step, cap), the step's examples sorted)
        self.grow = grow if grow is not None and grow.by else None
        if self.grow is not None and not train_max:
            raise ValueError("a length curriculum (data.task_grow_by) starts from data.task_train_max: set it")
        if global_batch_size % (micro_batch_size * dp):
            raise ValueError(f"train.global_batch_size={global_batch_size} is not a multiple of "
                             f"train.micro_batch_size={micro_batch_size} x {dp} data-parallel ranks")
        if not 0 <= dp_rank < dp:
            raise ValueError(f"data-parallel rank {dp_rank} is outside 0..{dp - 1}")
        self.micro_batch_size, self.global_batch_size = micro_batch_size, global_batch_size
        self.dp, self.dp_rank = dp, dp_rank
        self.accum = global_batch_size // (micro_batch_size * dp)
        self.step, self.micro = 0, 0  # the next micro-batch to read
        self.train_max_start, self.below = train_max, 0  # below: steps in a row under grow.loss
        self._cap(train_max)

    def _cap(self, train_max: int) -> None:
        """Train on lengths up to `train_max` (0: the whole grid) from the next micro-batch on."""
        self.train_max = train_max
        self.task = capped(self.base, train_max)  # train_max: data.task_train_max (0: the whole grid)
        # a capped stream pads to its own longest example (causal models: the scored positions' outputs
        # do not depend on padding after them, so only the compute changes)
        self.seq_len = min(self.seq_len_max, self.task.max_tokens()) if train_max else self.seq_len_max

    @property
    def grows(self) -> bool:
        """Whether the trainer must report each step's loss (observe): a length curriculum is on."""
        return self.grow is not None

    def observe(self, loss: float) -> dict[str, int]:
        """After each optimizer step, its training loss (the mean over every rank: all ranks decide
        alike): grow.steps steps in a row below grow.loss widen the training lengths by grow.by, up to
        the task's whole grid. Returns {"task_train_max": the new cap} on a step that grows it."""
        if self.grow is None or self.train_max == 0:
            return {}
        self.below = self.below + 1 if loss < self.grow.loss else 0
        if self.below < self.grow.steps:
            return {}
        self.below = 0
        top = max(self.base.train_lengths)
        self._cap(0 if self.train_max + self.grow.by >= top else self.train_max + self.grow.by)
        return {"task_train_max": self.train_max or top}

    def indices(self, step: int, micro: int) -> range:
        """Global example indices of this rank's micro-batch `micro` of optimizer step `step`."""
        start = step * self.global_batch_size + (micro * self.dp + self.dp_rank) * self.micro_batch_size
        return range(start, start + self.micro_batch_size)

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sort_by_length:  # padded to its own longest
            j = micro * self.dp + self.dp_rank
            b = pad_examples(self._sorted_step(step)[j * self.micro_batch_size:(j + 1) * self.micro_batch_size])
        else:
            b = make_batch(self.task, "train", self.indices(step, micro), None, self.seq_len)
        return to_tensors(b.tokens, b.targets)

    def _sorted_step(self, step: int) -> list:
        """Step `step`'s global batch at the current cap, sorted by token count (stable)."""
        if self._sorted is None or self._sorted[0] != (step, self.train_max):
            first = step * self.global_batch_size
            examples = [self.task.example("train", i, None) for i in range(first, first + self.global_batch_size)]
            self._sorted = (step, self.train_max), sorted(examples, key=lambda e: len(e.tokens))
        return self._sorted[1]

    def widths(self, step: int) -> list[int]:
        """The padded widths of step `step`'s equal parts of the global batch (every rank's), at the
        current cap: one part of seq_len, or with length buckets each micro-batch's own longest."""
        if not self.sort_by_length:
            return [self.seq_len]
        examples, size = self._sorted_step(step), self.micro_batch_size
        return [max(len(e.tokens) for e in examples[j:j + size]) for j in range(0, len(examples), size)]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            out = self.batch(self.step, self.micro)
            self.micro += 1
            if self.micro == self.accum:
                self.step, self.micro = self.step + 1, 0
            yield out

    def state_dict(self) -> dict[str, Any]:
        state = {"task": self.task.name, "train_lengths": list(self.task.train_lengths), "step": self.step,
                 "micro": self.micro, "global_batch_size": self.global_batch_size}
        if self.grow is not None:  # the cap reached is train_lengths' end
            state["curriculum"] = {**dataclasses.asdict(self.grow), "start": self.train_max_start, "below": self.below}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at a saved position; refuses a state of another task, another global batch (the
        example indices would shift), another length curriculum or another kind of loader."""
        if not isinstance(state, dict) or state.get("task") != self.task.name:
            got = state.get("task") if isinstance(state, dict) else None
            raise ValueError(f"the checkpoint's data position is not one of data.task={self.task.name!r} "
                             f"(it records task {got!r}): resume with the data it was trained on")
        mine = None if self.grow is None else {**dataclasses.asdict(self.grow), "start": self.train_max_start}
        saved_curriculum = state.get("curriculum")
        theirs = None if saved_curriculum is None else {k: v for k, v in saved_curriculum.items() if k != "below"}
        if theirs != mine:
            raise ValueError(f"the checkpoint trained with the length curriculum {theirs}, this run with {mine} "
                             f"(data.task_train_max, data.task_grow_*): the example stream would not continue")
        saved = state.get("train_lengths", list(get_task(self.task.name).train_lengths))  # older: the whole grid
        if mine is not None:  # the curriculum had reached this cap
            self._cap(0 if max(saved) >= max(self.base.train_lengths) else max(saved))
            self.below = int(saved_curriculum["below"])
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
        out.append(to_tensors(b.tokens, b.targets))
    return out


def rank_batches(pool: list, micro_batch_size: int, dp: int, dp_rank: int) -> list[list]:
    """Rank dp_rank's contiguous part of `pool` (len(pool) divisible by dp), in batches of one size: the
    largest divisor of the part that is <= micro_batch_size, so that the mean of batch means, then of
    rank means, is the mean over the whole pool."""
    part = len(pool) // dp
    mine = pool[dp_rank * part:(dp_rank + 1) * part]
    size = max(d for d in range(1, min(micro_batch_size, part) + 1) if part % d == 0)
    return [mine[start:start + size] for start in range(0, part, size)]
