"""Length buckets (data.task_sort_by_length): each optimizer step's examples sorted by length into its
micro-batches, each padded to its own longest. Checked against the unsorted loader and the task's
examples read one by one here (the same examples per step, every rank's part, the widths the trainer
counts, resumption), and, in float64, the gradients of a step against the padded step's."""
from __future__ import annotations

import itertools

import pytest
import torch

from rgpt_dist.algorithmic import get_task
from rgpt_dist.algorithmic.loader import Growth, TaskLoader
from rgpt_dist.config import ConfigError, load_config

SEQ, MB, G = 41, 2, 8


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def rows(x, y):
    """Each row's (tokens, targets) with the padding after the example cut off (padding: token 0 with
    target -1 to the end; parity's own tokens are never 0 with an unscored target at the end)."""
    out = []
    for tokens, targets in zip(x.tolist(), y.tolist()):
        n = len(tokens)
        while n and tokens[n - 1] == 0 and targets[n - 1] == -1:
            n -= 1
        out.append((tuple(tokens[:n]), tuple(targets[:n])))
    return out


@pytest.mark.parametrize("dp", [1, 2])
def test_a_step_holds_the_same_examples_sorted_each_part_padded_to_its_own_longest(dp):
    """Per step, the ranks' micro-batches together are the unsorted step's examples; part j = micro * dp
    + rank holds the j-th micro_batch_size of them by length (stable), padded to its own longest; the
    widths the trainer counts are those parts' widths."""
    task = get_task("parity")
    steps, per_rank = 3, G // (MB * dp)
    plain = take(TaskLoader("parity", SEQ, MB, G, 1, 0), steps * G // MB)
    ranks = [TaskLoader("parity", SEQ, MB, G, dp, d, sort_by_length=True) for d in range(dp)]
    got = [take(loader, steps * per_rank) for loader in ranks]
    for step in range(steps):
        expected = sum((rows(*b) for b in plain[step * G // MB:(step + 1) * G // MB]), [])
        first = step * G
        lengths = [len(task.example("train", i, None).tokens) for i in range(first, first + G)]
        order = sorted(range(G), key=lambda i: lengths[i])  # stable: index order among equals
        parts = [got[d][step * per_rank + m] for m in range(per_rank) for d in range(dp)]  # j = m * dp + d
        assert sum((rows(*p) for p in parts), []) == [expected[i] for i in order], step
        widths = [max(lengths[i] for i in order[j * MB:(j + 1) * MB]) for j in range(G // MB)]
        assert [p[0].shape for p in parts] == [(MB, w) for w in widths], step
        assert all(loader.widths(step) == widths for loader in ranks)
    assert TaskLoader("parity", SEQ, MB, G, 1, 0).widths(5) == [SEQ]  # unsorted: one part of seq_len


def test_buckets_follow_the_length_curriculum_and_resume_where_they_stopped():
    """Under a growing cap the buckets sort the capped stream's examples; a loader resumed from the
    state after step 1 continues with the same micro-batches as the one that ran on."""
    grow = Growth(by=8, loss=0.5, steps=1)
    loader = TaskLoader("parity", SEQ, MB, G, 1, 0, train_max=8, grow=grow, sort_by_length=True)
    stream = iter(loader)
    first = [next(stream) for _ in range(G // MB)]
    assert max(x.shape[1] for x, _ in first) <= 9 and loader.widths(0) == [x.shape[1] for x, _ in first]
    assert loader.observe(0.1) == {"task_train_max": 16}
    state = loader.state_dict()
    resumed = TaskLoader("parity", SEQ, MB, G, 1, 0, train_max=8, grow=grow, sort_by_length=True)
    resumed.load_state_dict(state)
    after = [next(stream) for _ in range(2 * G // MB)]
    again = take(resumed, 2 * G // MB)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(after, again))
    assert max(x.shape[1] for x, _ in after) > 9  # the widened cap's longer examples


def _problems(*overrides):
    base = ["model=gpt2-debug", "model.vocab_size=8", "data.task=parity", "data.paths=[]", "train.seq_len=41",
            "train.micro_batch_size=4", "train.global_batch_size=8", "train.loss_norm=example",
            "data.task_sort_by_length=true"]
    with pytest.raises(ConfigError) as e:
        load_config("configs/experiments/gpt2-small-20k.yaml", base + list(overrides))
    return str(e.value)


@pytest.mark.parametrize("overrides,message", [
    (["train.loss_norm=token"], "data.task_sort_by_length=true needs train.loss_norm=example (got 'token')"),
    (["train.micro_batch_size=8"], "train.global_batch_size=8 is one micro-batch of train.micro_batch_size=8"),
    (["data.task="], "data.task_sort_by_length=true needs data.task"),
])
def test_config_errors_name_the_values(overrides, message):
    assert message in _problems(*overrides)


def test_a_thinking_task_refuses_length_buckets():
    with pytest.raises(ConfigError, match="task_sort_by_length=true sorts an algorithmic task's examples"):
        load_config("configs/thinking/graph.yaml", ["data.task_sort_by_length=true"])


def _model(family_overrides: list[str], loss_norm: str = "example"):
    """The study's RLT-1 2 + 2 shape, narrowed (width 32), in float64, with the example-mean loss
    (or `loss_norm`); the same initial weights whatever the loss."""
    from rgpt_dist.models.flavours import FLAVOURS
    from rgpt_dist.models.layers import LayerFactory
    from rgpt_dist.models.spec import families
    from rgpt_dist.registry import build_model
    from rgpt_dist.sections import apply_overrides, from_dict
    data = apply_overrides({"model": dict(FLAVOURS["rlt-debug"])},
                           ["model.d_model=32", "model.d_ff=64", "model.n_head=2", *family_overrides])["model"]
    factory = LayerFactory()
    factory.loss_norm = loss_norm
    cfg = from_dict(families()[data["family"]].config, data, "model")
    return build_model(cfg, factory=factory, seed=0).double().train()


def _gradients(model, batches):
    """One optimizer step's gradients: the micro-batches' losses averaged, as the trainer does."""
    model.zero_grad(set_to_none=True)
    for x, y in batches:
        (model(x, y).loss / len(batches)).backward()
    return [p.grad.clone() for p in model.parameters()]


def _worst(got, reference) -> float:
    """The largest difference of any tensor's entries relative to that tensor's largest entry."""
    return max(float((a - b).abs().max()) / float(b.abs().max()) for a, b in zip(got, reference))


@pytest.mark.parametrize("task,cap,family_overrides", [("parity", 0, []),
                                                        ("s5_swaps", 16, ["model.feedback_interval=0"])],
                         ids=["parity-rlt1", "s5-rlt0"])
def test_the_buckets_give_the_padded_step_s_gradients(task, cap, family_overrides):
    """Float64: four buckets against one padded micro-batch of the same 16 examples: parity at 3-40
    bits with RLT-1 (its state runs position by position; one scored token per example) and swaps-S5
    at 1-16 operations with RLT-0 (every operation scored, so the example mean differs from the token
    mean). The terms are the same (a causal model's scored positions never see the padding after
    them), summed in other orders and blockings: float64 rounding, 2^-53 a step, through a backward of
    four layers whose sums run over at most 16 x 41 positions, a relative error of order 1e-13 at the
    most in each tensor; bounded here by 1e-12 of the tensor's largest entry. Under the token mean
    (refused with buckets) S5's short buckets weigh their tokens more: the same comparison then fails."""
    model = _model(family_overrides)
    padded = take(TaskLoader(task, SEQ, 16, 16, 1, 0, train_max=cap), 1)
    buckets = take(TaskLoader(task, SEQ, 4, 16, 1, 0, train_max=cap, sort_by_length=True), 4)
    assert padded[0][0].shape[1] > max(x.shape[1] for x, _ in buckets[:3])  # the buckets do drop padding
    reference = _gradients(model, padded)
    assert all(float(g.abs().max()) > 0 for g in reference)  # every tensor has a scale to compare at
    worst = _worst(_gradients(model, buckets), reference)
    assert worst < 1e-12, worst
    if task == "s5_swaps":
        token = _model(family_overrides, "token")
        assert _worst(_gradients(token, buckets), _gradients(token, padded)) > 1e-3
