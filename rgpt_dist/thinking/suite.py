"""The silent-thinking tasks (graph, logic, relational) as a task suite (rgpt_dist.data.suites):
what a thinking model trains on, and all it trains on. Its pairing with the model is the model's
spec's to check (ThinkingSpec.run_problems). The loaders (torch) are imported when asked for."""
from __future__ import annotations

from typing import Any, Mapping

from rgpt_dist.data.suites import TaskSuite
from rgpt_dist.thinking.tasks import TASKS, validation_problem


class ThinkingSuite(TaskSuite):
    name = "thinking"
    tasks_only = True

    def tasks(self) -> Mapping[str, Any]:
        return TASKS

    def data_problems(self, data: Any, path: str) -> list[str]:
        out = []
        if data.task_train_max:
            out.append(f"{path}.task_train_max={data.task_train_max!r} caps an algorithmic task's training "
                       f"lengths; thinking task {data.task!r} has none (0)")
        if data.task_sort_by_length:
            out.append(f"{path}.task_sort_by_length=true sorts an algorithmic task's examples by length; "
                       f"thinking task {data.task!r} pads every example to one length (false)")
        return out

    def validation_problem(self, task: str, dp: int) -> list[str]:
        return validation_problem(task, dp)

    def loaders(self, cfg: Any, dp: int, dp_rank: int) -> tuple[Any, list]:
        # the suite's loader pulls torch: config validation stays torch-free
        from rgpt_dist.thinking.loader import ThinkingLoader, validation_batches
        d, t = cfg.data, cfg.train
        train = ThinkingLoader(d.task, t.micro_batch_size, t.global_batch_size, dp, dp_rank)
        evaluate = bool(cfg.eval.every_steps)
        return train, validation_batches(d.task, t.micro_batch_size, dp, dp_rank) if evaluate else []


SUITE = ThinkingSuite()
