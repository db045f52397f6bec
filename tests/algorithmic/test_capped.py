"""rgpt_dist.algorithmic.capped and data.task_train_max: which caps are refused, with what message."""
from __future__ import annotations

import pytest

from rgpt_dist.algorithmic import TaskError, get_task
from rgpt_dist.algorithmic.capped import capped, problems
from rgpt_dist.config.experiment import ConfigError, load_config

from tests.algorithmic import solvers


def test_a_cap_keeps_the_grid_lengths_up_to_it_and_leaves_held_out_grids():
    task = capped(get_task("mod5_flat"), 10)
    assert task.train_lengths == (3, 5, 7, 9)
    assert task.lengths("val") == get_task("mod5_flat").lengths("val")
    assert task.lengths("test") == get_task("mod5_flat").lengths("test")
    assert capped(get_task("parity"), 0) is get_task("parity")


@pytest.mark.parametrize("name", ["s5_swaps", "s5_standard"])
def test_a_capped_s5_trains_on_every_length_up_to_the_cap_and_at_32_is_the_papers(name):
    """S5's grid is the single length 32: a cap below it trains on 1..cap operations, uniform, each
    scored at every operation as the solver composes it; the cap 32 is the task itself."""
    task = capped(get_task(name), 8)
    assert task.train_lengths == tuple(range(1, 9)) and task.max_tokens() == 9
    assert task.lengths("val") == (32,) and task.lengths("test") == get_task(name).lengths("test")
    lengths = set()
    for i in range(200):
        e = task.example("train", i)
        words = [task.vocab[t] for t in e.tokens[1:]]
        assert [task.vocab[t] for t in e.targets[1:]] == solvers.s5_states(words)
        lengths.add(len(words))
    assert lengths == set(range(1, 9))
    assert capped(get_task(name), 32) is capped(get_task(name), 40) is get_task(name)
    assert get_task(name).train_lengths == (32,)


@pytest.mark.parametrize("task,cap,message", [
    ("parity", 2, "below the shortest training length 3 of task 'parity' (its training grid: 3..40)"),
    ("mod5_brackets", 2, "below the shortest training length 3 of task 'mod5_brackets'"),
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
