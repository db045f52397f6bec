"""A task's training stream cut to its shorter lengths (`data.task_train_max`, a CPU-scale reduction).

    capped(get_task("parity"), 10)   # trains on 3..10 bits; validation and test grids unchanged

The capped task is a shallow copy whose `train_lengths` keeps the lengths <= the cap of the task's
`curriculum_lengths` (its training grid; for S5, whose grid is the single length 32, every length
1..32), so the training draw (`Task.draw_train_length`: uniform over the grid) and the seq_len check
(`Task.max_tokens`) follow it, while every held-out set is the task's own. A cap at or above the
grid's top is the task itself. Only tasks that draw their
training length from that grid can be capped (addition draws its operand widths inside the sample).
"""
from __future__ import annotations

import copy

from .base import Task, TaskError


def problems(task: Task, cap, where: str = "task_train_max") -> list[str]:
    """Why `cap` cannot cap the task's training lengths ([] when it can; 0 means no cap)."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        return [f"{where}={cap!r} must be an integer >= 0 (0 = the task's whole training grid)"]
    if cap == 0:
        return []
    if type(task).draw_train_length is not Task.draw_train_length:
        return [f"{where}={cap} cannot cap task {task.name!r}: it does not draw its training length from a "
                f"grid (use 0)"]
    grid = task.curriculum_lengths
    if cap < min(grid):
        return [f"{where}={cap} is below the shortest training length {min(grid)} "
                f"of task {task.name!r} (its training grid: {min(grid)}..{max(grid)})"]
    return []


def capped(task: Task, cap: int) -> Task:
    """The task itself at cap 0, else a copy training on its grid's lengths <= cap (TaskError if not)."""
    bad = problems(task, cap)
    if bad:
        raise TaskError(bad[0])
    if cap == 0 or cap >= max(task.train_lengths):
        return task
    out = copy.copy(task)
    out.train_lengths = tuple(n for n in task.curriculum_lengths if n <= cap)
    return out
