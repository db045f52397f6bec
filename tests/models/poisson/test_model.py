"""Heavy-tail Poisson depth against an independent re-implementation of its equations, and its
truncated backprop against a hand-written loop (#11)."""
from __future__ import annotations

import pytest
import torch

from rgpt_dist.models.poisson.config import PoissonConfig
from rgpt_dist.models.poisson.model import PoissonDepthGPT
from rgpt_dist.noise import NoiseKey
from tests.models import reference

CFG = dict(vocab_size=300, block_size=64, d_model=48, n_head=4, n_pre=1, n_rec=2, n_coda=1, n_loops=3, k_max=2,
           state_std=0.5)


def make(seed=0, dtype=torch.float64, **overrides):
    torch.manual_seed(seed)
    cfg = PoissonConfig(**{**CFG, **overrides})
    model = PoissonDepthGPT(cfg).to(dtype)
    with torch.no_grad():  # off the init: non-trivial LayerNorms and biases
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model, cfg


def batch(cfg, B=2, T=20, seed=1):
    idx = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(seed))
    return idx[:, :-1], idx[:, 1:]


@pytest.mark.parametrize("r", [0, 1, 3, 6])
def test_eval_forward_matches_reference(r):
    model, cfg = make()
    model.eval()
    idx, _ = batch(cfg)
    logits = model(idx, r=r).logits
    state = model._eval_state[: idx.shape[1]].double().expand(idx.shape[0], -1, -1)
    ref = reference.poisson_logits(model.state_dict(), cfg, idx, r, state)
    assert (logits - ref).abs().max() < 1e-10


@pytest.mark.parametrize("r", [1, 4])
def test_training_forward_matches_reference_with_its_noise_state(r):
    model, cfg = make()
    idx, _ = batch(cfg)
    key = NoiseKey(seed=7, step=3)
    state = key.normal("state", (*idx.shape, cfg.d_model), cfg.state_std, idx.device, torch.float64)
    ref = reference.poisson_logits(model.state_dict(), cfg, idx, r, state)
    assert (model(idx, r=r, noise_key=key).logits - ref).abs().max() < 1e-10


def test_all_exits_equal_forwards_at_each_depth_and_state_is_reproducible():
    model, cfg = make()
    model.eval()
    idx, tgt = batch(cfg)
    exits = model(idx, tgt, r=5, all_exits=True).aux["exit_losses"]
    for k in range(6):
        torch.testing.assert_close(exits[k], model(idx, tgt, r=k).loss, atol=1e-12, rtol=0)
    again, _ = make()
    torch.testing.assert_close(again.eval()(idx, r=2).logits, model(idx, r=2).logits, atol=0, rtol=0)


def _hand_written_truncated_loss(model, cfg, idx, tgt, r, key):
    """The first r - k steps by hand on a detached state, the last k with autograd."""
    sd = dict(model.named_parameters())
    e = model.embed(idx)
    for blk in model.prelude:
        e = blk(e)
    s = key.normal("state", e.shape, cfg.state_std, e.device, e.dtype)
    k = min(r, cfg.k_max)
    for i in range(r):
        x = torch.cat([s, e], -1) @ torch.cat([sd["recurrence.adapt_s.weight"], sd["recurrence.adapt_e.weight"]], 1).T
        for blk in model.recurrence.blocks:
            x = blk(x)
        s = x.detach() if i < r - k else x
    return model.readout(s, tgt)[1]  # the model's own loss (fp32 cross-entropy) on the hand-made state


@pytest.mark.parametrize("r", [1, 2, 5])
def test_truncated_backprop_gradients_equal_a_hand_written_detach_loop(r):
    model, cfg = make()
    idx, tgt = batch(cfg)
    key = NoiseKey(seed=3)
    model(idx, tgt, r=r, noise_key=key).loss.backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    _hand_written_truncated_loss(model, cfg, idx, tgt, r, key).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(ours[n], p.grad, atol=1e-12, rtol=0, msg=n)
    if r > cfg.k_max:  # the truncation is real: backprop through every step gives other gradients
        full_cfg = PoissonConfig(**{**CFG, "k_max": r})
        full = torch.autograd.grad(_hand_written_truncated_loss(model, full_cfg, idx, tgt, r, key),
                                   model.recurrence.adapt_s.weight)[0]
        assert not torch.allclose(full, ours["recurrence.adapt_s.weight"])


def test_no_grad_steps_store_no_activations():
    """Steps before the last k run without autograd: the saved-tensor count does not grow with r."""
    model, cfg = make(dtype=torch.float32)
    idx, tgt = batch(cfg)
    counts = []
    for r in (cfg.k_max, cfg.k_max + 4):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(1) or t, lambda t: t):
            model(idx, tgt, r=r, noise_key=NoiseKey(1))
        counts.append(len(saved))
    assert counts[0] == counts[1]


def test_config_rejects_bad_depth_settings():
    from rgpt_dist.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="k_max=0 must be >= 1"):
        load_config("poisson-debug", ["model.k_max=0"])
    with pytest.raises(ConfigError, match="mean depth must be > 1"):
        load_config("poisson-debug", ["model.n_loops=1"])
