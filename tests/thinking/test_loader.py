"""rgpt_dist/thinking/loader.py: the trainer's (ThinkingInputs, labels) batches of a thinking task."""
from __future__ import annotations

import pytest
import torch

from rgpt_dist.thinking.loader import VAL_PER_DIFFICULTY, ThinkingLoader, validation_batches, validation_problem
from rgpt_dist.thinking.tasks import TASKS


def test_two_ranks_read_one_rank_s_global_batch_and_resume_exactly():
    one = ThinkingLoader("graph", 4, 8, 1, 0)
    ranks = [ThinkingLoader("graph", 4, 8, 2, r) for r in (0, 1)]
    for step in range(3):
        whole = torch.cat([one.batch(step, m)[0].tokens for m in range(2)])           # micro 0, 1 of one rank
        split = torch.cat([ranks[r].batch(step, 0)[0].tokens for r in (0, 1)])        # micro 0 of rank 0, 1
        assert torch.equal(whole, split)
    task = TASKS["graph"]
    x, y = one.batch(2, 1)
    expected = [task.example("train", i) for i in range(2 * 8 + 4, 2 * 8 + 8)]      # step 2, micro 1
    assert x.tokens.shape == (4, task.max_len) and torch.equal(y, x.labels)
    assert [e.label for e in expected] == y.tolist() and [e.difficulty for e in expected] == x.difficulty.tolist()
    it = iter(one)
    seen = [next(it)[0].tokens for _ in range(5)]
    state = one.state_dict()
    resumed = ThinkingLoader("graph", 4, 8, 1, 0)
    resumed.load_state_dict(state)
    assert (resumed.step, resumed.micro) == (2, 1) and torch.equal(next(iter(resumed))[0].tokens, next(it)[0].tokens)
    assert not torch.equal(seen[0], seen[1])


def test_a_state_of_another_task_or_batch_is_refused():
    state = ThinkingLoader("graph", 4, 8, 1, 0).state_dict()
    with pytest.raises(ValueError, match="records task 'graph'"):
        ThinkingLoader("logic", 4, 8, 1, 0).load_state_dict(state)
    with pytest.raises(ValueError, match="global_batch_size=8, this run has 16"):
        ThinkingLoader("graph", 4, 16, 1, 0).load_state_dict(state)
    with pytest.raises(ValueError, match="not a multiple"):
        ThinkingLoader("graph", 3, 8, 1, 0)


def test_validation_is_split_evenly_and_covers_every_training_difficulty():
    lo, hi = TASKS["relational"].train_range
    n = (hi - lo + 1) * VAL_PER_DIFFICULTY
    one = validation_batches("relational", 32, 1, 0)
    two = [validation_batches("relational", 32, 2, r) for r in (0, 1)]
    labels = lambda bs: torch.cat([y for _, y in bs])  # noqa: E731
    assert sum(len(y) for _, y in one) == n and torch.equal(labels(one), torch.cat([labels(b) for b in two]))
    diffs = torch.cat([x.difficulty for x, _ in one])
    assert sorted(set(diffs.tolist())) == list(range(lo, hi + 1)) and labels(one).float().mean() == 0.5
    assert validation_problem("relational", 3) and not validation_problem("relational", 4)
