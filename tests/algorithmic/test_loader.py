"""rgpt_dist.algorithmic.loader: the trainer-side stream of an algorithmic task. Example indices, rank
slicing, the -100 -> -1 target mapping, padding, exact resumption and the validation split, against
the generators' examples read one by one here."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from rgpt_dist.algorithmic import get_task, make_batch
from rgpt_dist.algorithmic.loader import Growth, TaskLoader, validation_batches, validation_problem

SEQ, MB, G = 44, 2, 8


def expected(task, split, pairs, seq_len=SEQ):
    """(x, y) built example by example: tokens padded with 0, targets -1 where unscored or padding."""
    x = torch.zeros(len(pairs), seq_len, dtype=torch.int64)
    y = torch.full((len(pairs), seq_len), -1, dtype=torch.int64)
    for row, (length, i) in enumerate(pairs):
        e = task.example(split, i, length)
        n = len(e.tokens)
        x[row, :n] = torch.tensor(e.tokens)
        y[row, :n] = torch.tensor(np.where(e.mask, e.targets, -1))
    return x, y


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def test_micro_batches_are_the_global_stream_in_order():
    """dp=1: micro-batch k of the run holds examples k*MB .. k*MB + MB - 1 of the training stream."""
    task = get_task("addition")
    got = take(TaskLoader("addition", SEQ, MB, G, 1, 0), 6)
    for k, (x, y) in enumerate(got):
        ex, ey = expected(task, "train", [(None, i) for i in range(k * MB, k * MB + MB)])
        assert torch.equal(x, ex) and torch.equal(y, ey), k
    # the generators' IGNORE_INDEX (-100) never reaches the model: unscored positions are -1, and the
    # scored ones are exactly the masked ones (addition: the answer tokens and EOS of every example)
    ex_mask = torch.from_numpy(make_batch(task, "train", range(MB), seq_len=SEQ).mask)
    assert not (got[0][1] == -100).any() and torch.equal(got[0][1] != -1, ex_mask)


def test_data_parallel_ranks_together_read_one_process_global_batch():
    """dp=2: per step, the two ranks' micro-batches are exactly the dp=1 step's examples, disjoint;
    a tensor-parallel peer (same dp rank) reads the same ones."""
    one = torch.cat([x for x, _ in take(TaskLoader("parity", SEQ, MB, G, 1, 0), 2 * G // MB)])
    ranks = [take(TaskLoader("parity", SEQ, MB, G, 2, d), 2 * G // (2 * MB)) for d in range(2)]
    per_step = G // (2 * MB)
    for step in range(2):
        got = torch.cat([ranks[d][step * per_step + m][0] for m in range(per_step) for d in range(2)])
        assert torch.equal(got, one[step * G:(step + 1) * G]), step
    assert not torch.equal(ranks[0][0][0], ranks[1][0][0])
    twin = take(TaskLoader("parity", SEQ, MB, G, 2, 1), 2 * G // (2 * MB))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(twin, ranks[1]))


def test_state_dict_resumes_the_stream_exactly():
    first = TaskLoader("mod5_flat", SEQ, MB, G, 2, 1)
    it = iter(first)
    for _ in range(4 * 2):  # two optimizer steps of 2 micro-batches
        next(it)
    state = first.state_dict()
    assert state == {"task": "mod5_flat", "train_lengths": list(range(3, 40, 2)), "step": 4, "micro": 0,
                     "global_batch_size": G}
    later = [next(it) for _ in range(3)]
    resumed = TaskLoader("mod5_flat", SEQ, MB, G, 2, 1)
    resumed.load_state_dict(state)
    again = take(resumed, 3)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(later, again))


@pytest.mark.parametrize("state,message", [
    ({"task": "parity", "step": 1, "micro": 0, "global_batch_size": G}, "records task 'parity'"),
    ({"task": "mod5_flat", "step": 1, "micro": 0, "global_batch_size": 16}, "global_batch_size=16"),
    ({"epoch": 0, "sample_in_epoch": 8}, "records task None"),
])
def test_a_foreign_loader_state_is_refused(state, message):
    with pytest.raises(ValueError, match=message):
        TaskLoader("mod5_flat", SEQ, MB, G, 1, 0).load_state_dict(state)


def test_a_capped_stream_is_the_grid_cut_at_the_cap_padded_to_its_longest():
    """data.task_train_max=10: every training length in 3..10, each one drawn, the lengths drawn as
    uniform over the cut grid by the generator's own rule (checked against a copy with the grid set
    by hand), padding to 11 tokens; cap 0 and a cap at the grid's end are the uncapped stream."""
    loader = TaskLoader("parity", 41, 64, 64, 1, 0, train_max=10)
    x, y = loader.batch(0, 0)
    assert x.shape == (64, 11) and loader.seq_len == 11
    task = get_task("parity")
    hand = type(task)()
    hand.train_lengths = tuple(range(3, 11))
    ex, ey = expected(hand, "train", [(None, i) for i in range(64)], 11)
    assert torch.equal(x, ex) and torch.equal(y, ey)
    lengths = {len(hand.example("train", i).tokens) - 1 for i in range(64)}
    assert lengths == set(range(3, 11))
    assert get_task("parity").train_lengths == tuple(range(3, 41))        # the registered task is untouched
    for cap in (0, 40, 99):
        same = TaskLoader("parity", 41, 4, 4, 1, 0, train_max=cap)
        assert torch.equal(same.batch(3, 0)[0], TaskLoader("parity", 41, 4, 4, 1, 0).batch(3, 0)[0])


def test_a_stream_with_another_cap_is_not_resumed():
    state = TaskLoader("parity", 41, MB, G, 1, 0, train_max=10).state_dict()
    with pytest.raises(ValueError, match=r"trained on lengths \[3, 4, .*data.task_train_max"):
        TaskLoader("parity", 41, MB, G, 1, 0).load_state_dict(state)
    old = {"task": "parity", "step": 1, "micro": 0, "global_batch_size": G}   # written before the cap existed
    TaskLoader("parity", 41, MB, G, 1, 0).load_state_dict(old)
    with pytest.raises(ValueError, match="data.task_train_max"):
        TaskLoader("parity", 41, MB, G, 1, 0, train_max=10).load_state_dict(old)


def test_validation_is_the_whole_set_split_evenly_over_ranks():
    """parity: 3 lengths x 256 pooled; dp=2 halves in order, equal batches of <= micro_batch_size."""
    task = get_task("parity")
    pairs = [(n, i) for n in task.lengths("val") for i in range(256)]
    ex, ey = expected(task, "val", pairs)
    parts = [validation_batches("parity", SEQ, 20, 2, d) for d in range(2)]
    assert {len(x) for part in parts for x, _ in part} == {16}     # 384 per rank: 16 divides it, 17..20 do not
    x = torch.cat([x for part in parts for x, _ in part])
    y = torch.cat([y for part in parts for _, y in part])
    assert torch.equal(x, ex) and torch.equal(y, ey)


def test_an_uneven_validation_split_is_refused_naming_the_numbers():
    assert validation_problem("parity", 4) == []
    [problem] = validation_problem("addition", 3)
    assert "256 validation examples" in problem and "3 data-parallel ranks" in problem
    with pytest.raises(ValueError, match="256 validation examples"):
        validation_batches("addition", SEQ, MB, 3, 0)


def test_a_length_curriculum_grows_the_cap_after_steps_in_a_row_below_the_loss():
    """data.task_grow_*: 3 steps in a row below 0.01 widen 3-8 to 3-16, a step above restarts the count,
    the last growth reaches the whole grid (logged as its longest length) and nothing grows after it;
    the batches follow the cap at once (width, lengths), as a loader built at that cap reads them."""
    loader = TaskLoader("parity", 41, 8, 8, 1, 0, train_max=8, grow=Growth(by=8, loss=0.01, steps=3))
    assert loader.grows and not TaskLoader("parity", 41, 8, 8, 1, 0, train_max=8).grows
    seen = [loader.observe(loss) for loss in (0.005, 0.001, 0.5, 0.0, 0.0)]
    assert seen == [{}] * 5 and loader.seq_len == 9
    assert loader.observe(0.0) == {"task_train_max": 16}
    assert loader.seq_len == 17 and max(loader.task.train_lengths) == 16
    assert torch.equal(loader.batch(5, 0)[0], TaskLoader("parity", 41, 8, 8, 1, 0, train_max=16).batch(5, 0)[0])
    grown = [loader.observe(0.0) for _ in range(9)]
    assert grown[2] == {"task_train_max": 24} and grown[5] == {"task_train_max": 32}
    assert grown[8] == {"task_train_max": 40} and loader.train_max == 0 and loader.seq_len == 41
    assert [loader.observe(0.0) for _ in range(6)] == [{}] * 6
    assert get_task("parity").train_lengths == tuple(range(3, 41))


def test_an_s5_curriculum_grows_from_short_words_to_the_papers_fixed_32_and_resumes_there():
    """S5 capped at 8 reads words of 1..8 operations padded to 9 tokens; growth by 12 gives 1..20, then
    the paper's fixed 32; a state saved there resumes on 32 only, the same next batch."""
    loader = TaskLoader("s5_swaps", 33, 4, 4, 1, 0, train_max=8, grow=Growth(by=12, loss=0.5, steps=1))
    assert loader.seq_len == 9 and loader.task.train_lengths == tuple(range(1, 9))
    assert loader.observe(0.1) == {"task_train_max": 20} and loader.seq_len == 21
    assert loader.observe(0.1) == {"task_train_max": 32} and loader.train_max == 0
    assert loader.task.train_lengths == (32,) and loader.seq_len == 33
    x, y = take(loader, 2)[1]
    assert (x[:, 1:] != 0).all() and (y[:, 1:] != -1).all()   # every word 32 operations, every one scored
    resumed = TaskLoader("s5_swaps", 33, 4, 4, 1, 0, train_max=8, grow=Growth(by=12, loss=0.5, steps=1))
    resumed.load_state_dict(loader.state_dict())
    assert resumed.task.train_lengths == (32,) and torch.equal(take(resumed, 1)[0][0], take(loader, 1)[0][0])


def test_a_curriculum_resumes_at_its_cap_and_count_and_refuses_another():
    """A state saved mid-curriculum (cap 16, one step below the loss) continues the same stream: the
    next batch, and the growth one step later; another curriculum, or none, is refused."""
    grow = Growth(by=8, loss=0.01, steps=2)
    first = TaskLoader("parity", 41, 4, 4, 1, 0, train_max=8, grow=grow)
    for loss in (0.0, 0.0, 0.0):
        first.observe(loss)
    take(first, 3)
    state = first.state_dict()
    resumed = TaskLoader("parity", 41, 4, 4, 1, 0, train_max=8, grow=grow)
    resumed.load_state_dict(state)
    assert resumed.seq_len == 17 and resumed.below == 1
    assert torch.equal(take(resumed, 1)[0][0], take(first, 1)[0][0])
    assert resumed.observe(0.0) == first.observe(0.0) == {"task_train_max": 24}
    for other in (TaskLoader("parity", 41, 4, 4, 1, 0, train_max=8, grow=Growth(8, 0.02, 2)),
                  TaskLoader("parity", 41, 4, 4, 1, 0, train_max=8)):
        with pytest.raises(ValueError, match=r"length curriculum .*data.task_grow_\*"):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="starts from data.task_train_max"):
        TaskLoader("parity", 41, 4, 4, 1, 0, grow=grow)
