"""rgpt_dist.algorithmic.capped and data.task_train_max: which caps are refused, with what message."""
from __future__ import annotations

import pytest

from rgpt_dist.algorithmic import TaskError, get_task
from rgpt_dist.algorithmic.capped import capped, problems
from rgpt_dist.config.experiment import ConfigError, load_config


def test_a_cap_keeps_the_grid_lengths_up_to_it_and_leaves_held_out_grids():
    task = capped(get_task("mod5_flat"), 10)
    assert task.train_lengths == (3, 5, 7, 9)
    assert task.lengths("val") == get_task("mod5_flat").lengths("val")
    assert task.lengths("test") == get_task("mod5_flat").lengths("test")
    assert capped(get_task("parity"), 0) is get_task("parity")


@pytest.mark.parametrize("task,cap,message", [
    ("parity", 2, "below the shortest training length 3 of task 'parity' (its training grid: 3..40)"),
    ("s5_swaps", 16, "shortest training length 32"),
    ("addition", 4, "does not draw its training length from a grid"),
    ("parity", -1, "must be an integer >= 0"),
    ("parity", True, "must be an integer >= 0"),
])
def test_a_bad_cap_is_refused_naming_it(task, cap, message):
    assert message in problems(get_task(task), cap)[0]
    with pytest.raises(TaskError, match="task_train_max"):
        capped(get_task(task), cap)


def test_the_config_validates_the_cap_before_anything_runs():
    cfg = load_config(None, ["model=rlt1-debug", "data.task=parity", "data.task_train_max=10", "train.seq_len=41"])
    assert cfg.data.task_train_max == 10
    with pytest.raises(ConfigError, match=r"data.task_train_max=2 is below the shortest training length 3 of task 'parity'"):
        load_config(None, ["model=rlt1-debug", "data.task=parity", "data.task_train_max=2", "train.seq_len=41"])
    with pytest.raises(ConfigError, match=r"data.task_train_max=10 needs data.task"):
        load_config(None, ["model=rlt1-debug", "data.task_train_max=10", "data.paths=[x]"])
