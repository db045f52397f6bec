"""The attention's initialisation option (model.attn_init): `mha`, the authors' graph block's
nn.MultiheadAttention init (xavier-uniform over the stacked [3d, d] q/k/v weight, zero in- and output
biases), checked against its distribution with a bound from the sample size; `linear`, the default,
unchanged (torch's nn.Linear init, drawing exactly what it drew before the option existed)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from rgpt_dist.thinking.config import ThinkingModelConfig, config_for
from rgpt_dist.thinking.model import Attention, ThinkingModel, build

DELTA = 1e-9
"""Allowed chance that a correct init fails a distribution check (per check)."""


def dkw_bound(n: int, delta: float = DELTA) -> float:
    """Dvoretzky-Kiefer-Wolfowitz: P(sup_x |F_n(x) - F(x)| > eps) <= 2 exp(-2 n eps^2) for n i.i.d.
    draws, so eps = sqrt(ln(2 / delta) / (2 n)) is exceeded with probability <= delta."""
    return math.sqrt(math.log(2 / delta) / (2 * n))


def ks_uniform(w: torch.Tensor, bound: float) -> float:
    """sup_x |F_n(x) - F(x)| of the sample w against U(-bound, bound) (evaluated at the sample points,
    both sides of each jump)."""
    x = w.detach().double().flatten().sort().values
    n = x.numel()
    cdf = ((x + bound) / (2 * bound)).clamp(0, 1)                                  # F at each sample
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return max((i / n - cdf).abs().max().item(), (cdf - (i - 1) / n).abs().max().item())


def graph_attention(attn_init: str, seed: int = 0) -> Attention:
    torch.manual_seed(seed)
    return ThinkingModel(config_for("graph", vocab_size=27, attn_init=attn_init)).core.residual.attn


def test_mha_init_is_xavier_uniform_with_zero_biases():
    attn = graph_attention("mha")
    d = attn.qkv.in_features                                                           # 128
    w = attn.qkv.weight                                                                # [3d, d]: 49,152 draws
    xavier = math.sqrt(6 / (d + 3 * d))                                                # fan_in d, fan_out 3d
    assert w.shape == (3 * d, d) and w.abs().max().item() <= xavier
    assert ks_uniform(w, xavier) <= dkw_bound(w.numel())                               # 0.0148 at n = 49,152
    assert torch.count_nonzero(attn.qkv.bias) == 0 and torch.count_nonzero(attn.proj.bias) == 0
    # the output weight keeps nn.Linear's U(-1/sqrt(d), 1/sqrt(d)) (nn.MultiheadAttention leaves it)
    assert ks_uniform(attn.proj.weight, 1 / math.sqrt(d)) <= dkw_bound(attn.proj.weight.numel())


def test_the_check_tells_the_two_inits_apart():
    """The bound has the power to see the difference: the default's q/k/v weight (bound 1/sqrt(d) =
    0.088 at d = 128) is far from xavier's U(+-0.108) (sup |F_n - F| about 0.09 > 0.0148)."""
    default = graph_attention("linear").qkv.weight
    d = default.shape[1]
    assert ks_uniform(default, math.sqrt(6 / (4 * d))) > 4 * dkw_bound(default.numel())
    assert ks_uniform(default, 1 / math.sqrt(d)) <= dkw_bound(default.numel())


def test_the_default_is_torchs_linear_init_unchanged():
    """attn_init defaults to `linear`, which draws exactly what two nn.Linear layers draw from the same
    generator state and nothing more (the rest of the model's draws are the ones before the option)."""
    cfg = ThinkingModelConfig(vocab_size=11, d_model=16, n_head=4, d_ff=24, max_steps=6)
    assert cfg.attn_init == "linear"
    torch.manual_seed(3)
    attn = Attention(cfg)
    after = torch.get_rng_state()
    torch.manual_seed(3)
    qkv, proj = nn.Linear(16, 48), nn.Linear(16, 16)
    assert torch.equal(torch.get_rng_state(), after)
    for got, want in ((attn.qkv, qkv), (attn.proj, proj)):
        assert torch.equal(got.weight, want.weight) and torch.equal(got.bias, want.bias)
    for flavour in ("graph", "logic"):
        for layers in (None, 2):
            torch.manual_seed(5)
            implicit = build(config_for(flavour, vocab_size=11), layers).state_dict()
            torch.manual_seed(5)
            explicit = build(config_for(flavour, vocab_size=11, attn_init="linear"), layers).state_dict()
            assert all(torch.equal(implicit[k], explicit[k]) for k in implicit)


def test_the_fixed_depth_baseline_takes_the_option_in_every_block():
    torch.manual_seed(0)
    model = build(config_for("graph", vocab_size=27, attn_init="mha"), 3)
    assert all(torch.count_nonzero(block.attn.qkv.bias) == 0 for block in model.core)


@pytest.mark.parametrize("value", ["xavier", "MHA", ""])
def test_an_unknown_init_is_refused_by_name(value):
    cfg = ThinkingModelConfig(attn_init=value)
    assert f"model.attn_init={value!r} is not one of linear, mha" in cfg.problems()
    with pytest.raises(ValueError, match="attn_init"):
        ThinkingModel(cfg)
