"""Ouro against an independent re-implementation of its equations (tests/models/reference.py, fp64):
the training objective and its gradients, the fixed-depth evaluation, the per-token exit at a
threshold, and the FLOPs training adds by reading out every iteration (#14)."""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.flops import executed_forward_flops, head_flops, train_flops
from rgpt_dist.models.ouro.config import OuroConfig
from rgpt_dist.models.ouro.model import OuroGPT
from rgpt_dist.models.spec import spec_for
from tests.models import reference

CFG = dict(vocab_size=300, block_size=64, d_model=48, n_head=4, n_pre=1, n_rec=2, n_coda=1, n_loops=3,
           entropy_beta=0.3)


def make(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = OuroConfig(**{**CFG, **overrides})
    model = OuroGPT(cfg).double()
    with torch.no_grad():  # off the init: non-trivial LayerNorms, biases and exit gates
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        model.exits.gate.proj.weight.mul_(20)  # gates spread over (0, 1), not all near 0.5
    return model, cfg


def batch(cfg, B=2, T=20, seed=1):
    idx = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(seed))
    return idx[:, :-1], idx[:, 1:]


@pytest.mark.parametrize("r", [1, 2, 3, 5])
def test_training_objective_and_gradients_match_reference(r):
    model, cfg = make()
    idx, tgt = batch(cfg)
    out = model.train()(idx, tgt, r=r)
    objective = out.loss + out.aux["aux_loss"]
    sd = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    ref_objective, ref_loss = reference.ouro_objective(sd, cfg, idx, tgt, r)
    assert abs(out.loss.item() - ref_loss.item()) < 1e-10
    assert abs(objective.item() - ref_objective.item()) < 1e-10
    objective.backward()
    ref_objective.backward()
    for name, p in model.named_parameters():
        if name.startswith("exits.gate.") and r == 1:  # one iteration: p(1) = 1, the gate is unused
            assert p.grad is None and sd[name].grad is None
            continue
        assert (p.grad - sd[name].grad).abs().max() < 1e-10, name
    if r > 1:  # the gate is trained by the objective (not only by the final loss)
        assert model.exits.gate.proj.weight.grad.abs().max() > 1e-3


def test_stats_are_the_exit_distribution_per_iteration():
    model, cfg = make()
    idx, tgt = batch(cfg)
    stats = model.train()(idx, tgt).aux["stats"]
    losses, lambdas = reference.ouro_readouts(model.state_dict(), cfg, idx, tgt, cfg.n_loops)
    p = reference.ouro_exit_probs(lambdas)
    torch.testing.assert_close(stats["exit_prob"], torch.stack([q.mean() for q in p]), atol=1e-10, rtol=0)
    torch.testing.assert_close(stats["step_loss"], torch.stack([v.mean() for v in losses]), atol=1e-10, rtol=0)
    assert stats["exit_lambda"][-1] == 1 and stats["exit_prob"].sum().item() == pytest.approx(1, abs=1e-12)


def test_padding_targets_are_left_out_of_the_objective():
    model, cfg = make()
    idx, tgt = batch(cfg)
    masked = tgt.clone()
    masked[:, :5] = -1
    out = model.train()(idx, masked)
    losses, lambdas = reference.ouro_readouts(model.state_dict(), cfg, idx, tgt, cfg.n_loops)
    p = reference.ouro_exit_probs(lambdas)
    per_token = sum(a * b for a, b in zip(p, losses)) + cfg.entropy_beta * sum(q * torch.log(q) for q in p)
    keep = masked >= 0
    assert abs((out.loss + out.aux["aux_loss"]).item() - per_token[keep].mean().item()) < 1e-10


@pytest.mark.parametrize("r", [1, 3, 6])
def test_evaluation_is_the_plain_loop_at_any_depth(r):
    """In eval mode a depth-r forward reads out once: its loss is the reference's at iteration r,
    and all_exits gives the loss of every iteration (exit 0: the prelude straight into the coda)."""
    model, cfg = make()
    idx, tgt = batch(cfg)
    model.eval()
    losses, _ = reference.ouro_readouts(model.state_dict(), cfg, idx, tgt, r)
    assert abs(model(idx, tgt, r=r).loss.item() - losses[-1].mean().item()) < 1e-10
    exits = model(idx, tgt, r=r, all_exits=True).aux["exit_losses"]
    torch.testing.assert_close(exits[1:], torch.stack([v.mean() for v in losses]), atol=1e-10, rtol=0)
    assert abs(exits[0].item() - model(idx, tgt, r=0).loss.item()) < 1e-12


@pytest.mark.parametrize("q", [0.3, 0.6, 0.95, 1.0])
def test_exit_at_threshold_matches_reference(q):
    model, cfg = make()
    idx, tgt = batch(cfg)
    depth, loss = model.eval().exit_at_threshold(idx, tgt, q)
    losses, lambdas = reference.ouro_readouts(model.state_dict(), cfg, idx, tgt, cfg.n_loops)
    p = reference.ouro_exit_probs(lambdas)
    cdf = torch.stack(p).cumsum(0)
    want = torch.full_like(depth, cfg.n_loops)
    for t in reversed(range(cfg.n_loops - 1)):  # the first t whose cdf reaches q
        want = torch.where(cdf[t] >= q, torch.full_like(want, t + 1), want)
    assert torch.equal(depth, want)
    ref_loss = torch.stack(losses).gather(0, (want - 1)[None]).squeeze(0)
    assert (loss - ref_loss).abs().max() < 1e-10
    if q < 1:
        assert len(depth.unique()) > 1, "the test gates should send tokens to different depths"


def test_flops_of_training_count_every_readout():
    """torch's flop counter on a training forward: inference forward + head + r - 1 more exits."""
    cfg = load_config("ouro-debug", ["model.vocab_size=512", "model.block_size=64", "model.pad_vocab_multiple=64",
                                     "model.n_loops=3", "train.seq_len=64"]).model
    model = OuroGPT(cfg).train()
    idx = torch.randint(0, cfg.vocab_size, (2, 49))
    spec = spec_for(cfg)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(idx[:, :-1], idx[:, 1:])
    forward = executed_forward_flops(cfg, 48, 3) + head_flops(cfg) + spec.train_readout_flops(cfg, 48, 3)
    assert counter.get_total_flops() == pytest.approx(96 * forward, rel=0.02)
    assert train_flops(cfg, 48) == pytest.approx(3 * forward, rel=1e-3)
    # a token leaving at iteration 1 spends one core, one coda and one gate after the prelude
    assert spec.exit_flops(cfg, 48, 3) > spec.exit_flops(cfg, 48, 1) > executed_forward_flops(cfg, 48, 0)


def test_config_is_validated():
    with pytest.raises(ConfigError, match="model.entropy_beta=-0.1 must be >= 0"):
        load_config("ouro-debug", ["model.entropy_beta=-0.1"])
    with pytest.raises(ConfigError, match="model.exit_threshold=0.0 must be > 0"):
        load_config("ouro-debug", ["model.exit_threshold=0"])
    assert spec_for("ouro").depth_sampler(load_config("ouro-small-isoflops").model)(1337, 9) == 10
