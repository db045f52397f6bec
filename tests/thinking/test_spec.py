"""The thinking model as a task model (rgpt_dist/thinking/spec.py, trainable.py): flavours, parameter
and FLOP counts against the built model and torch's counter, run-level validation, and the trainer's
call (loss, exit curve, statistics) against losses written here from SPEC section 8."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.flops import executed_forward_flops, head_flops, param_count, param_split, train_flops
from rgpt_dist.models.spec import all_specs, families, spec_for
from rgpt_dist.registry import build_model
from rgpt_dist.thinking.spec import SPEC
from rgpt_dist.thinking.inputs import make_batch
from rgpt_dist.thinking.tasks import TASKS

BASE = ["parallel.activation_checkpointing=none"]


def config(flavour: str, task: str | None = None, *overrides: str):
    task = task or ("graph" if "graph" in flavour else flavour.split("-")[1])
    return load_config(None, [f"model={flavour}", f"data.task={task}", *BASE, *overrides])


def test_the_specs_table_of_task_inputs_is_the_generators():
    from rgpt_dist.thinking.spec import TASK_INPUTS
    assert TASK_INPUTS == {name: {"vocab_size": t.vocab_size, "readout_k": t.readout_k,
                                  "n_roles": 2 if t.name == "graph" else 0} for name, t in TASKS.items()}
    x = make_batch(TASKS["graph"], "train", range(8), None, 20)
    assert int(x.roles.max()) == TASK_INPUTS["graph"]["n_roles"]  # source 1, target 2


def test_a_task_model_not_a_language_model_family():
    assert "thinking" in all_specs() and "thinking" not in families() and spec_for("thinking") is SPEC
    assert SPEC.task_suite == "thinking" and all(s.task_suite == "algorithmic" for s in families().values())


@pytest.mark.parametrize("flavour", sorted(SPEC.flavours))
def test_every_flavour_counts_its_parameters_exactly(flavour):
    cfg = config(flavour).model
    model = build_model(cfg)
    assert param_count(cfg) == sum(p.numel() for p in model.parameters())
    n_once, n_rec = param_split(cfg)
    assert n_once + n_rec == param_count(cfg, embeddings=False)
    shared = sum(p.numel() for n, p in model.named_parameters() if n.startswith("core.") and "depth_emb" not in n)
    assert n_rec == (0 if cfg.fixed_layers else shared)  # the block, its gate and gains; not the depth rows


@pytest.mark.parametrize("flavour,steps", [("thinking-graph-debug", 3), ("thinking-graph-debug-fixed", None),
                                           ("thinking-relational", 2)])
def test_executed_flops_equal_torchs_counter(flavour, steps):
    cfg = config(flavour).model
    task = TASKS["graph" if "graph" in flavour else "relational"]
    model = build_model(cfg).eval()
    x = make_batch(task, "train", range(4), None, task.max_len)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x, x.labels, r=steps)
    expected = x.tokens.numel() * (executed_forward_flops(cfg, task.max_len, steps) + head_flops(cfg))
    assert counter.get_total_flops() == pytest.approx(expected, rel=1e-12)
    assert head_flops(cfg) == 0  # no language-model head
    if steps:  # training: 3 x forward at the sampler's mean depth (uniform: linear in r)
        mean = (cfg.train_steps_min + cfg.train_steps_max) / 2
        assert train_flops(cfg, task.max_len) == pytest.approx(3 * executed_forward_flops(cfg, task.max_len, mean))


@pytest.mark.parametrize("overrides,message", [
    (["model=gpt2-debug", "data.task=graph"], "this pair needs a thinking model"),
    (["model=thinking-graph-debug", "data.task=parity"], "this pair needs a thinking task"),
    (["model=thinking-logic", "data.task=graph"], "model.readout_k=1 differs from data.task='graph'"),
    (["model=thinking-graph-debug", "data.task=graph", "model.vocab_size=5"], "model.vocab_size=5 is smaller"),
    (["model=thinking-graph-debug", "data.task=graph", "parallel.compile=blocks"], "parallel.compile='blocks'"),
    (["model=thinking-graph-debug", "data.task=graph", "parallel.tp_size=2"], "does not support tensor parallelism"),
    (["model=thinking-graph-debug", "data.task=graph", "data.task_train_max=3"], "thinking task 'graph' has none"),
    (["model=thinking-graph-debug", "data.task=graph", "model.fixed_layers=-1"], "model.fixed_layers=-1 must be >= 0"),
])
def test_bad_pairs_are_refused_before_any_process(overrides, message):
    with pytest.raises(ConfigError) as refused:
        load_config(None, [*BASE, *overrides])  # later overrides win
    assert message in str(refused.value)


def bce(logits, labels):
    """Binary cross-entropy with logits, the mean over the batch, written out."""
    y = labels.double()
    z = logits.double()
    return (torch.clamp(z, min=0) - z * y + torch.log1p(torch.exp(-z.abs()))).mean()


@pytest.mark.parametrize("alpha", [0.0, 0.4])
def test_the_trainers_call_returns_the_thinking_loss_and_the_exit_curve(alpha):
    cfg = config("thinking-graph-debug", None, f"model.supervision_alpha={alpha}").model
    model = build_model(cfg, seed=3).double().eval()
    task = TASKS["graph"]
    x = make_batch(task, "train", range(6), None, task.max_len)
    out = model(x, x.labels, r=4, all_exits=True, stats=True)
    with torch.no_grad():
        every = model.logits(x, 4, all_steps=True)                       # [4, B]
        step0 = model.readout(model.embed(x), x.readout)                 # the head on the embedding
    per_step = torch.stack([bce(every[t], x.labels) for t in range(4)])
    expected = (1 - alpha) * per_step[-1] + alpha * per_step.mean()
    assert abs(out.loss.item() - expected.item()) < 1e-12
    curve = torch.cat([bce(step0, x.labels)[None], per_step])
    assert out.aux["exit_losses"].shape == (5,) and (out.aux["exit_losses"] - curve).abs().max() < 1e-12
    assert out.aux["stats"]["accuracy"].item() == ((every[-1] > 0).long() == x.labels).float().mean().item()
    assert out.aux["eval_metrics"]["val_accuracy"].item() == out.aux["stats"]["accuracy"].item()
    assert torch.equal(model(x, x.labels).logits, model.logits(x, cfg.train_steps_max))  # r None: the largest trained
    with pytest.raises(ValueError, match="no KV cache"):
        model(x, x.labels, cache=object())


def test_the_fixed_depth_baseline_takes_no_depth():
    cfg = config("thinking-graph-debug-fixed").model
    assert spec_for(cfg).depth_sampler(cfg) is None and spec_for(cfg).layout(cfg) == "6 blocks"
    model = build_model(cfg, seed=0).eval()
    x = make_batch(TASKS["graph"], "train", range(4), None, 20)
    out = model(x, x.labels, all_exits=True)
    assert out.aux["exit_losses"].shape == (2,)  # the embedding's readout, then the 6 blocks'
    assert math.isclose(out.loss.item(), F.binary_cross_entropy_with_logits(out.logits, x.labels.float()).item(),
                        rel_tol=1e-6)
