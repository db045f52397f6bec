"""RecurrentGPT's silent-thinking switches (issue #28): LayerScale on the shared core's blocks
(model.layerscale) and the identity-biased gate's convention (gate_bias_init +2 = the thinking gate's
b_z = -2). The references are written here from the equations (the model's docstring):

    core block:  x = x + gamma_1 * attn(LN_1(x)),  x = x + gamma_2 * mlp(LN_2(x))     gamma_k (d,)
    step:        h~ = W_h (h + eps_x) + W_pre h_pre,  o = core(h~),
                 g = sigmoid(W_2 silu(W_1h LN_h(h) + b_1 + W_1p LN_p(h_pre)) + b_2) / tau + eps_g),
                 h_next = g h + (1 - g) o
"""
import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch

from rgpt_dist.config import ConfigError, RecurrentGPTConfig, load_config
from rgpt_dist.flops import param_count, param_split
from rgpt_dist.models.recurrent_gpt.model import RecurrentGPT
from rgpt_dist.noise import NoiseKey

CFG = dict(vocab_size=300, block_size=32, d_model=32, n_head=4, n_pre=1, n_rec=2, n_coda=1, n_loops=3)
EXPERIMENTS = Path(__file__).resolve().parents[2] / "configs" / "experiments"


def make(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = RecurrentGPTConfig(**{**CFG, **overrides})
    return RecurrentGPT(cfg), cfg


def tokens(B=2, T=12, seed=1):
    return torch.randint(0, CFG["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


# ---- the reference, from the equations ---------------------------------------------------------
def ln(x, sd, p, eps):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps) * sd[p + "weight"] + sd[p + "bias"]


def attn(x, sd, p, n_head):
    """Causal softmax attention; qkv's output features grouped per head as [q_h | k_h | v_h]."""
    T, hd = x.shape[1], x.shape[2] // n_head
    qkv = x @ sd[p + "qkv.weight"].T + sd[p + "qkv.bias"]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    heads = []
    for h in range(n_head):
        q, k, v = (qkv[..., (3 * h + j) * hd:(3 * h + j + 1) * hd] for j in range(3))
        heads.append(torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(future, -math.inf), -1) @ v)
    return torch.cat(heads, -1) @ sd[p + "proj.weight"].T + sd[p + "proj.bias"]


def mlp(x, sd, p):
    a = x @ sd[p + "fc.weight"].T + sd[p + "fc.bias"]
    a = 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))  # tanh-GELU
    return a @ sd[p + "proj.weight"].T + sd[p + "proj.bias"]


def block(x, sd, p, cfg, scaled):
    g1, g2 = (sd[p + "ls_1"], sd[p + "ls_2"]) if scaled else (1.0, 1.0)
    x = x + g1 * attn(ln(x, sd, p + "ln_1.", cfg.ln_eps), sd, p + "attn.", cfg.n_head)
    return x + g2 * mlp(ln(x, sd, p + "ln_2.", cfg.ln_eps), sd, p + "mlp.")


def step(h, h_pre, sd, cfg, eps_x=0.0, eps_g=0.0):
    p = "recurrence."
    o = (h + eps_x) @ sd[p + "proj_h.weight"].T + h_pre @ sd[p + "proj_pre.weight"].T
    for i in range(cfg.n_rec):
        o = block(o, sd, f"{p}blocks.{i}.", cfg, scaled=True)
    a = (ln(h, sd, p + "ln_h.", cfg.ln_eps) @ sd[p + "gate_h.weight"].T + sd[p + "gate_h.bias"]
         + ln(h_pre, sd, p + "ln_pre.", cfg.ln_eps) @ sd[p + "gate_pre.weight"].T)
    f = (a * torch.sigmoid(a)) @ sd[p + "gate_out.weight"].T + sd[p + "gate_out.bias"]
    g = torch.sigmoid(f / cfg.tau + eps_g)
    return g * h + (1 - g) * o


def logits(idx, sd, cfg, r):
    """The whole model, its prelude and coda blocks plain (no gains)."""
    h = sd["embed.wte.weight"][idx] + sd["embed.wpe.weight"][:idx.shape[1]]
    for i in range(cfg.n_pre):
        h = block(h, sd, f"prelude.{i}.", cfg, scaled=False)
    h_pre = h
    for _ in range(r):
        h = step(h, h_pre, sd, cfg)
    for i in range(cfg.n_coda):
        h = block(h, sd, f"coda.{i}.", cfg, scaled=False)
    return ln(h, sd, "head.ln_f.", cfg.ln_eps) @ sd["embed.wte.weight"].T


def randomised(seed=0, **overrides):
    """A float64 model off its init: every tensor moved, the gains spread around 0.5 so that both
    branches weigh in a step (at 1e-4 they would sit below the tolerance), the gate bias ~N(0, 1)."""
    model, cfg = make(seed, layerscale=1e-4, sigma_x=0.3, sigma_g=0.4, tau=0.8, **overrides)
    model.double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if ".ls_" in name else 0.02))
            if ".ls_" in name:
                p.add_(0.5)
        model.recurrence.gate_out.bias.normal_(0.0, 1.0)
    return model, cfg


# ---- tests ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("noise", [False, True])
def test_one_core_step_with_layerscale_matches_the_fp64_reference(noise):
    """One recurrence step (GatedRecurrence) on random h, h_pre (B, T, d), noise drawn from the step's
    key as the model does; measured error 8.9e-16 with and without noise (fp64 rounding; leaving the
    gains out of the reference moves it by 0.07), held to 1e-10."""
    model, cfg = randomised()
    g = torch.Generator().manual_seed(3)
    h, h_pre = (torch.randn(2, 12, cfg.d_model, generator=g, dtype=torch.float64) for _ in range(2))
    key = NoiseKey(seed=7, step=2, micro_batch=1).at(0) if noise else None
    with torch.no_grad():
        got, _ = model.recurrence(h, model.recurrence.anchor(h_pre), 0, key)
        draws = {}
        if noise:
            draws = {"eps_x": key.normal("x", h.shape, cfg.sigma_x, h.device, h.dtype),
                     "eps_g": key.normal("g", h.shape, cfg.sigma_g, h.device, h.dtype)}
        expected = step(h, h_pre, model.state_dict(), cfg, **draws)
    err = (got - expected).abs().max().item()
    assert err <= 1e-10, err
    assert (expected - h).abs().max() > 0.1  # the step moves the state: a non-degenerate comparison


def test_whole_model_with_layerscale_matches_the_fp64_reference():
    """Gains in the shared core only: the full forward at r = 2 against the reference whose prelude
    and coda are plain blocks (measured 4.4e-16 on logits up to 0.64), held to 1e-10."""
    model, cfg = randomised()
    idx = tokens()
    with torch.no_grad():
        err = (model.eval()(idx, r=2).logits - logits(idx, model.state_dict(), cfg, 2)).abs().max().item()
    assert err <= 1e-10, err


class Before:
    """A model config from before the field (an older export's config.json): every attribute of cfg but
    layerscale, which the class does not define either."""

    def __init__(self, cfg):
        self.__dict__.update({k: v for k, v in dataclasses.asdict(cfg).items() if k != "layerscale"})
        self.padded_vocab_size, self.head_dim = cfg.padded_vocab_size, cfg.head_dim


def test_layerscale_zero_is_bitwise_the_model_without_the_field():
    """layerscale = 0 (explicit or default) builds exactly the model of a config without the field: the
    same state-dict keys in the same order, no gain, every tensor and the logits (eval, and training
    with noise) bitwise equal."""
    idx, key = tokens(), NoiseKey(seed=5, step=1)
    default, cfg = make()
    torch.manual_seed(0)
    before = RecurrentGPT(Before(cfg))
    assert not hasattr(before.cfg, "layerscale")
    explicit, _ = make(layerscale=0.0)
    ref = before.state_dict()
    for model in (default, explicit):
        sd = model.state_dict()
        assert list(sd) == list(ref) and all(torch.equal(sd[k], ref[k]) for k in ref)
        with torch.no_grad():
            for train in (False, True):
                a = model.train(train)(idx, r=3, noise_key=key).logits
                b = before.train(train)(idx, r=3, noise_key=key).logits
                assert torch.equal(a, b)
    assert not any("ls_" in k for k in ref) and param_count(cfg) == sum(p.numel() for p in default.parameters())


def test_gains_sit_on_the_core_blocks_only_and_leave_every_other_weight_as_it_was():
    """layerscale > 0 adds exactly ls_1, ls_2 (d,) to each shared-core block, initialised to the value,
    counted by param_count and in N_rec; every other tensor is the layerscale = 0 model's, bitwise,
    and with the gains set to 1 the logits are the plain model's, bitwise (x + 1 * y == x + y)."""
    plain, cfg0 = make()
    scaled, cfg = make(layerscale=1e-4)
    a, b = plain.state_dict(), scaled.state_dict()
    gains = {f"recurrence.blocks.{i}.ls_{k}" for i in range(cfg.n_rec) for k in (1, 2)}
    assert set(b) - set(a) == gains and set(a) <= set(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(b[k].shape == (cfg.d_model,) and torch.all(b[k] == 1e-4) for k in gains)
    added = 2 * cfg.n_rec * cfg.d_model
    assert param_count(cfg) == sum(p.numel() for p in scaled.parameters()) == param_count(cfg0) + added
    assert param_split(cfg)[1] - param_split(cfg0)[1] == added  # N_rec: the core's
    with torch.no_grad():
        for k in gains:
            scaled.get_parameter(k).fill_(1.0)
        idx, key = tokens(), NoiseKey(seed=5, step=1)
        got, want = (m.train()(idx, r=3, noise_key=key).logits for m in (scaled, plain))
    assert torch.equal(got, want)


def test_gains_are_replicated_under_tensor_parallelism():
    """The split the tp factory would give each parameter (reshard.layout_for): the gains, like the
    norms' weights, are whole on every rank (None)."""
    from rgpt_dist.parallel.reshard import layout_for

    _, cfg = make(layerscale=1e-4)
    layout = layout_for(cfg)
    assert {k: v for k, v in layout.items() if ".ls_" in k} == {
        f"recurrence.blocks.{i}.ls_{k}": None for i in range(cfg.n_rec) for k in (1, 2)}
    assert layout["recurrence.blocks.0.ln_1.weight"] is None and layout["recurrence.blocks.0.attn.qkv.weight"] == 0


@pytest.mark.parametrize("value,message", [("-0.1", "model.layerscale=-0.1 must be >= 0"),
                                           (".nan", "model.layerscale=nan must be finite"),
                                           ("inf", "model.layerscale=inf must be finite")])
def test_layerscale_is_validated_naming_the_value(value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("recurrentgpt-debug", [f"model.layerscale={value}"])
    assert load_config("recurrentgpt-debug", ["model.layerscale=1e-4"]).model.layerscale == 1e-4


def test_a_hand_edited_config_reaching_the_model_is_refused():
    """An export's config.json reaches the layers without problems(): the model refuses the value."""
    _, cfg = make()
    bad = Before(cfg)
    bad.layerscale = -1.0
    with pytest.raises(ValueError, match=r"layerscale=-1.0 must be a finite number >= 0"):
        RecurrentGPT(bad)


def test_the_thinking_gate_bias_is_gate_bias_init_plus_2():
    """The paper's h <- z h' + (1 - z) h, z = sigmoid(b_z) with b_z = -2 when its weights vanish, is
    this model's step with gate_bias_init = +2 (tau = 1, no noise) and the gate's last weight zeroed:
    h_next = z o + (1 - z) h with o the core's output, i.e. sigmoid(2) = 0.881 of the old state kept."""
    model, cfg = make(gate_bias_init=2.0, layerscale=1e-4)
    rec = model.recurrence
    g = torch.Generator().manual_seed(4)
    h, h_pre = (torch.randn(2, 12, cfg.d_model, generator=g) for _ in range(2))
    with torch.no_grad():
        rec.gate_out.weight.zero_()
        got, gate = rec(h, rec.anchor(h_pre), 0, None)
        o = rec.proj_h(h) + rec.proj_pre(h_pre)
        for blk in rec.blocks:
            o = blk(o)
    z = torch.sigmoid(torch.tensor(-2.0))
    torch.testing.assert_close(got, z * o + (1 - z) * h, atol=1e-6, rtol=0)
    torch.testing.assert_close(gate, torch.full_like(gate, 1 / (1 + math.exp(-2))), atol=1e-7, rtol=0)
    assert abs(gate.mean().item() - 0.8808) < 1e-4


def test_the_ablation_pair_differs_in_the_two_switches_only():
    """configs/experiments/ablation-b6-gate-thinking.yaml against its partner, the main grid's small run
    (the paper's gate +4, no LayerScale: the defaults; rgpt_dist.studies.ablation.grid.REUSED): the thinking
    recipe (+2, LayerScale 1e-4), all else equal."""
    from rgpt_dist.studies.ablation.grid import REUSED
    assert REUSED["ablation-b6-gate-recurrentgpt"] == "recurrentgpt-small-isoflops-20k"
    a, b = (load_config(EXPERIMENTS / f"{n}.yaml") for n in ("recurrentgpt-small-isoflops-20k", "ablation-b6-gate-thinking"))
    assert (a.model.gate_bias_init, a.model.layerscale) == (4.0, 0.0) == (RecurrentGPTConfig.gate_bias_init, 0.0)
    assert (b.model.gate_bias_init, b.model.layerscale) == (2.0, 1e-4)
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        d["model"].pop("gate_bias_init"), d["model"].pop("layerscale"), d["log"].pop("run_dir")
    assert da == db


@torch.no_grad()
def test_cached_decoding_with_layerscale_equals_the_full_sequence():
    """The gains ride the core blocks' KV-cache path too: chunks decoded through a full cache give the
    full sequence's logits (fp64: measured 3.3e-16 on logits up to 0.62, held to 1e-12)."""
    model, _ = randomised()
    model.eval()
    idx = tokens(T=11)
    full = model(idx, r=3).logits
    cache = model.make_cache("full", 3)
    got = torch.cat([model(idx[:, a:b], r=3, cache=cache).logits for a, b in ((0, 5), (5, 6), (6, 11))], dim=1)
    err = (got - full).abs().max().item()
    assert err <= 1e-12 and full.abs().max() > 0.1, err
