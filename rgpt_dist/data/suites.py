"""Task suites: data generated on the fly (`data.task`) instead of token shards, each behind a
`TaskSuite` the way a model family is behind its FamilySpec. The model's spec names the suite it
trains on (FamilySpec.task_suite): a language model's algorithmic tasks (rgpt_dist.algorithmic.suite:
(x, y) token batches) or a thinking model's tasks (rgpt_dist.thinking.suite: (ThinkingInputs,
labels) batches).

The suites live above the trainer (they bring their own evaluation and tables), so config, data and
train reach them only through this registry: discovered by module name on first use
(SUITE_MODULES), as the task models are (rgpt_dist.models.spec.TASK_MODEL_MODULES). No torch import
here; a suite imports its loaders only when asked for them."""
from __future__ import annotations

import importlib
from typing import Any, ClassVar, Mapping, Sequence

from rgpt_dist.models.spec import spec_for

SUITE_MODULES = ("rgpt_dist.algorithmic.suite", "rgpt_dist.thinking.suite")
"""Modules defining a `SUITE`: a TaskSuite instance."""


class TaskSuite:
    """What config validation, the preflight, the trainer and the exporter ask of a task suite."""

    name: ClassVar[str] = ""
    """The FamilySpec.task_suite of the models that train on it."""
    tasks_only: ClassVar[bool] = False
    """Its models train on its tasks only (a thinking model has no token-shard loader); False: a
    language model, which trains on token shards unless data.task names a task."""

    def tasks(self) -> Mapping[str, Any]:
        """Task name -> task."""
        raise NotImplementedError

    def data_problems(self, data: Any, path: str) -> list[str]:
        """What the data section `data` (at `path`) asks of its data.task that the suite cannot do
        (data.task_train_max, data.task_sort_by_length)."""
        return []

    def config_problems(self, cfg: Any) -> list[str]:
        """What the task needs of the rest of the run's config (sequence length, vocabulary)."""
        return []

    def validation_problem(self, task: str, dp: int) -> list[str]:
        """Why the task's validation set cannot be split evenly over dp ranks ([] when it can)."""
        raise NotImplementedError

    def loaders(self, cfg: Any, dp: int, dp_rank: int) -> tuple[Any, list]:
        """(training loader, validation batches: [] without evaluation) of data.task for one rank."""
        raise NotImplementedError

    def vocab(self, task: str) -> Sequence[str]:
        """The task's token symbols (id = index), for the tokenizer an export ships."""
        raise ValueError(f"a model trained on {self.name} task {task!r} has no export")


_SUITES: dict[str, TaskSuite] | None = None


def suites() -> dict[str, TaskSuite]:
    """name -> suite, discovered once."""
    global _SUITES
    if _SUITES is None:
        found = (getattr(importlib.import_module(m), "SUITE") for m in SUITE_MODULES)
        _SUITES = {s.name: s for s in found}
    return _SUITES


def suite_of_task(task: str) -> TaskSuite | None:
    """The suite holding a task called `task`, None when none does."""
    return next((s for s in suites().values() if task in s.tasks()), None)


def not_a_task(task: str) -> str:
    """The message for a data.task no suite holds, naming every suite's tasks."""
    known = [f"a{'n' if n[0] in 'aeiou' else ''} {n} task ({', '.join(sorted(s.tasks()))})"
             for n, s in suites().items()]
    return f"{task!r} is not {' or '.join(known)}"


def pairing_problem(task: str, model_suite: str) -> str | None:
    """Why a model of `model_suite` cannot train on `task` (None when it can, or no suite holds it)."""
    suite = suite_of_task(task)
    if suite is None or suite.name == model_suite:
        return None
    wants = f"a {suite.name} model (model={', '.join(suite.tasks())} or *-debug)" if suite.tasks_only else \
        f"a {model_suite} task ({', '.join(suites()[model_suite].tasks())})"
    return f"this pair needs {wants}"


def _suite(cfg: Any) -> TaskSuite:
    """The suite of the run's model (FamilySpec.task_suite)."""
    return suites()[spec_for(cfg.model).task_suite]


def source_problems(cfg: Any) -> list[str]:
    """A model of a tasks-only suite (a thinking model) has no token-shard loader."""
    suite = _suite(cfg)
    if suite.tasks_only and not cfg.data.task:
        return [f"data.task='': model.family={cfg.model.family!r} trains on a {suite.name} task "
                f"({', '.join(suite.tasks())}), not on token shards"]
    return []


def validation_problem(cfg: Any, dp: int) -> list[str]:
    """Why the task's validation set cannot be split evenly over dp ranks ([] when it can)."""
    return _suite(cfg).validation_problem(cfg.data.task, dp)


def task_loaders(cfg: Any, dp: int, dp_rank: int) -> tuple[Any, list]:
    """(training loader, validation batches) of data.task for one data-parallel rank."""
    return _suite(cfg).loaders(cfg, dp, dp_rank)
