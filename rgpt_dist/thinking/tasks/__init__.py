"""The three thinking tasks (SPEC section 8): graph reachability, nested boolean logic, relational text.
numpy only at import; `make_batch` / `collate` import torch when called. Shared machinery (the example
record, determinism, splits, label balance, buckets, batching) is in base.py; each task's module
docstring records the authors' definitions and every choice made where they are vague.
"""
from __future__ import annotations

from .base import (ThinkingExample, ThinkingTask, ThinkingTaskError, bucket, collate,  # noqa: F401
                   make_batch)
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
