"""`data.task`'s two suites, chosen by the model's spec (FamilySpec.task_suite): a language model's
algorithmic tasks (rgpt_dist.data.algorithmic: (x, y) token batches) or a thinking model's tasks
(rgpt_dist.thinking.loader: (ThinkingInputs, labels) batches). The one place that picks between them."""
from __future__ import annotations

from typing import Any

from rgpt_dist.models.spec import spec_for


def _thinking(cfg: Any) -> bool:
    return spec_for(cfg.model).task_suite == "thinking"


def source_problems(cfg: Any) -> list[str]:
    """A thinking model has no token-shard loader: it trains on a thinking task only."""
    if _thinking(cfg) and not cfg.data.task:
        from rgpt_dist.thinking.tasks import TASKS
        return [f"data.task='': model.family={cfg.model.family!r} trains on a thinking task ({', '.join(TASKS)}), "
                f"not on token shards"]
    return []


def validation_problem(cfg: Any, dp: int) -> list[str]:
    """Why the task's validation set cannot be split evenly over dp ranks ([] when it can)."""
    if _thinking(cfg):
        from rgpt_dist.thinking.loader import validation_problem as thinking
        return thinking(cfg.data.task, dp)
    from rgpt_dist.data.algorithmic import validation_problem as algorithmic
    return algorithmic(cfg.data.task, dp)


def task_loaders(cfg: Any, dp: int, dp_rank: int) -> tuple[Any, list]:
    """(training loader, validation batches) of data.task for one data-parallel rank."""
    d, t = cfg.data, cfg.train
    evaluate = bool(cfg.eval.every_steps)
    if _thinking(cfg):
        from rgpt_dist.thinking.loader import ThinkingLoader, validation_batches
        train = ThinkingLoader(d.task, t.micro_batch_size, t.global_batch_size, dp, dp_rank)
        return train, validation_batches(d.task, t.micro_batch_size, dp, dp_rank) if evaluate else []
    from rgpt_dist.data.algorithmic import TaskLoader, validation_batches
    train = TaskLoader(d.task, t.seq_len, t.micro_batch_size, t.global_batch_size, dp, dp_rank, d.task_train_max)
    return train, validation_batches(d.task, t.seq_len, t.micro_batch_size, dp, dp_rank) if evaluate else []
