"""RecurrentGPT's component switches (#15: the rows of the paper's sequential ablation, Fig. 5)
against an independent re-implementation of each ablated recurrence (tests/models/reference.py,
fp64): injection none / state / concat, gate none / learned, state noise at every step or only at
initialisation; parameters and FLOPs follow the switches; the full model is unchanged."""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from rgpt_dist.config import ConfigError, RecurrentGPTConfig, load_config
from rgpt_dist.flops import executed_forward_flops, head_flops, param_count
from rgpt_dist.models.recurrent_gpt.model import RecurrentGPT
from rgpt_dist.noise import NoiseKey
from tests.models import reference

CFG = dict(vocab_size=300, block_size=64, d_model=48, n_head=4, n_pre=1, n_rec=2, n_coda=1, n_loops=3,
           sigma_x=0.3, sigma_g=0.0, tau=0.7)
# Fig. 5's rows: recurrence alone (whole stack shared), + prelude/coda, + state noise, + prelude
# re-injection, + the gate (the full model); and noise at initialisation only
ROWS = {"recurrence": dict(n_pre=0, n_coda=0, injection="none", gate="none", sigma_x=0.0),
        "prelude_coda": dict(injection="none", gate="none", sigma_x=0.0),
        "state_noise": dict(injection="none", gate="none"),
        "noise_at_init": dict(injection="none", gate="none", state_noise="init"),
        "projection": dict(injection="state", gate="none"),
        "reinjection": dict(injection="concat", gate="none"),
        "gate_without_reinjection": dict(injection="state"),
        "full": dict()}


def make(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = RecurrentGPTConfig(**{**CFG, **overrides})
    model = RecurrentGPT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        if cfg.gate == "learned":
            model.recurrence.gate_out.bias.normal_(0.0, 1.0)
    return model, cfg


@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize("train", [False, True])
def test_each_ablation_matches_its_reference(row, train):
    model, cfg = make(**ROWS[row])
    idx = torch.randint(0, cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    key = NoiseKey(seed=3, step=2)
    out = model.train(train)(idx, r=3, noise_key=key).logits
    noise = None
    if train and cfg.sigma_x > 0:
        noise = [key.at(i).normal("x", (*idx.shape, cfg.d_model), cfg.sigma_x, idx.device, torch.float64)
                 for i in range(3)]
    with torch.no_grad():
        expected = reference.recurrent_ablation_logits(model.state_dict(), cfg, idx, 3, noise)
    assert (out - expected).abs().max() < 1e-10 and out.abs().max() > 0.1


def test_noise_at_init_differs_from_every_step():
    idx = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    key = NoiseKey(seed=3, step=2)
    outs = [make(**ROWS[row])[0].train()(idx, r=3, noise_key=key).logits for row in ("state_noise", "noise_at_init")]
    assert (outs[0] - outs[1]).abs().max() > 1e-3


@pytest.mark.parametrize("row", list(ROWS))
def test_parameters_and_flops_follow_the_switches(row):
    model, cfg = make(**ROWS[row])
    assert param_count(cfg) == sum(p.numel() for p in model.parameters())
    idx = torch.randint(0, cfg.vocab_size, (2, 32))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        model.eval()(idx, r=3)
    assert counter.get_total_flops() == pytest.approx(idx.numel() * (executed_forward_flops(cfg, 32, 3) + head_flops(cfg)))
    every = {n for n, _ in make()[0].named_parameters()}
    names = {n for n, _ in model.named_parameters()}
    assert ("recurrence.proj_pre.weight" in names) == (cfg.injection == "concat")
    assert ("recurrence.gate_out.weight" in names) == (cfg.gate == "learned") and names <= every


def test_the_full_model_is_unchanged():
    """The defaults are the full model: the same parameters, initialised identically, as before the switches."""
    torch.manual_seed(0)
    plain = RecurrentGPT(RecurrentGPTConfig(**{k: v for k, v in CFG.items()}))
    torch.manual_seed(0)
    full = RecurrentGPT(RecurrentGPTConfig(**CFG, injection="concat", gate="learned", state_noise="every_step"))
    a, b = plain.state_dict(), full.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_switches_are_validated():
    with pytest.raises(ConfigError, match="model.gate='open' is not one of"):
        load_config("recurrentgpt-debug", ["model.gate=open"])
    with pytest.raises(ConfigError, match="model.injection='both' is not one of"):
        load_config("recurrentgpt-debug", ["model.injection=both"])
    cfg = load_config("recurrentgpt-debug", ["model.gate=none", "model.injection=state", "model.state_noise=init"])
    assert (cfg.model.gate, cfg.model.injection, cfg.model.state_noise) == ("none", "state", "init")
