"""The algorithmic tasks of the RLT paper as a task suite (rgpt_dist.data.suites): what a language
model trains on when data.task names one of them. Numpy only at import; the loaders (torch) are
imported when asked for."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from rgpt_dist.algorithmic import TASKS, capped, get_task, validation_problem
from rgpt_dist.data.suites import TaskSuite


class AlgorithmicSuite(TaskSuite):
    name = "algorithmic"

    def tasks(self) -> Mapping[str, Any]:
        return TASKS

    def data_problems(self, data: Any, path: str) -> list[str]:
        cap = data.task_train_max
        return capped.problems(TASKS[data.task], cap, f"{path}.task_train_max") if cap else []

    def config_problems(self, cfg: Any) -> list[str]:
        """Every training and validation example fits train.seq_len (and a learned position table),
        and its token ids fit the vocabulary."""
        task = TASKS[cfg.data.task]
        need = max(task.max_tokens_of("train"), task.max_tokens_of("val"))
        where = f"the longest {task.name} training or validation example has {need} tokens"
        out = []
        if cfg.train.seq_len < need:
            out.append(f"train.seq_len={cfg.train.seq_len} is too short for data.task={task.name!r}: {where}; "
                       f"set train.seq_len >= {need}")
        if cfg.model.vocab_size < len(task.vocab):
            out.append(f"model.vocab_size={cfg.model.vocab_size} is smaller than data.task={task.name!r}'s "
                       f"vocabulary of {len(task.vocab)} tokens")
        if getattr(cfg.model, "pos_encoding", "learned") == "learned" and cfg.model.block_size < need:
            out.append(f"model.block_size={cfg.model.block_size} is too small for data.task={task.name!r} with "
                       f"model.pos_encoding=learned: {where}; set model.block_size >= {need}")
        return out + _sort_problems(cfg)  # a value failing two bounds (inf) is reported once

    def validation_problem(self, task: str, dp: int) -> list[str]:
        return validation_problem(task, dp)

    def loaders(self, cfg: Any, dp: int, dp_rank: int) -> tuple[Any, list]:
        # the suite's loader pulls torch: config validation stays torch-free
        from rgpt_dist.algorithmic.loader import Growth, TaskLoader, validation_batches
        d, t = cfg.data, cfg.train
        grow = Growth(d.task_grow_by, d.task_grow_loss, d.task_grow_steps) if d.task_grow_by else None
        train = TaskLoader(d.task, t.seq_len, t.micro_batch_size, t.global_batch_size, dp, dp_rank,
                           d.task_train_max, grow, d.task_sort_by_length)
        evaluate = bool(cfg.eval.every_steps)
        return train, validation_batches(d.task, t.seq_len, t.micro_batch_size, dp, dp_rank) if evaluate else []

    def vocab(self, task: str) -> Sequence[str]:
        return get_task(task).vocab


def _sort_problems(cfg: Any) -> list[str]:
    """data.task_sort_by_length: only where it keeps the step's loss (example normalisation) and has
    more than one micro-batch to sort into."""
    if not cfg.data.task_sort_by_length:
        return []
    out = []
    if cfg.train.loss_norm != "example":
        out.append(f"data.task_sort_by_length=true needs train.loss_norm=example (got {cfg.train.loss_norm!r}): "
                   f"under token normalisation each micro-batch's mean would weigh the tokens of short examples "
                   f"more than the step's mean does")
    if cfg.train.global_batch_size <= cfg.train.micro_batch_size:
        out.append(f"data.task_sort_by_length=true sorts a step's examples into its micro-batches, but "
                   f"train.global_batch_size={cfg.train.global_batch_size} is one micro-batch of "
                   f"train.micro_batch_size={cfg.train.micro_batch_size}: set it to a divisor of the global "
                   f"batch below it (a quarter: four buckets per step)")
    return out


SUITE = AlgorithmicSuite()
