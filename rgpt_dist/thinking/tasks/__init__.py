"""The three thinking tasks (SPEC section 8): graph reachability, nested boolean logic, relational text.
numpy only; batches of them as torch tensors are rgpt_dist/thinking/inputs.py's (`collate`,
`make_batch`). Shared machinery (the example record, determinism, splits, label balance, buckets)
is in base.py; each task's module docstring records the authors' definitions and every choice made where they are vague.
"""
from __future__ import annotations

from .base import ThinkingExample, ThinkingTask, ThinkingTaskError, bucket  # noqa: F401
from .graph import GraphReachability
from .logic import NestedLogic
from .relational import RelationalText

TASKS: dict[str, ThinkingTask] = {
    "graph": GraphReachability(),
    "logic": NestedLogic(),
    "relational": RelationalText(),
}


def get_task(name) -> ThinkingTask:
    """The task registered under `name`, or ThinkingTaskError naming it and the known ones."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        known = ", ".join(TASKS)
        raise ThinkingTaskError(f"unknown thinking task {name!r}: expected one of {known}") from None


VAL_PER_DIFFICULTY = 64
"""Validation examples per training difficulty (rgpt_dist.thinking.loader)."""


def validation_size(task: str) -> int:
    lo, hi = get_task(task).train_range
    return (hi - lo + 1) * VAL_PER_DIFFICULTY


def validation_problem(task: str, dp: int) -> list[str]:
    """Why the validation set cannot be split evenly over dp ranks ([] when it can)."""
    n = validation_size(task)
    return [] if n % dp == 0 else [
        f"the {n} validation examples of data.task={task!r} do not split evenly over {dp} data-parallel ranks"]
