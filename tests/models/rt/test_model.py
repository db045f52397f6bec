"""The layerwise Recurrent Transformer family (issue 27): the model against an fp64 reference written
here from SPEC section 9's equations (a per-position loop with an explicit softmax, importing nothing
it checks), the tiled and naive forwards against each other in logits and every gradient, cached
decoding against recomputation, the cache's size, FLOPs (Eq. 1 by formula, executed against torch's
counter), parameters against the dense partners, and what the family refuses."""
from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.flops import executed_forward_flops, forward_flops, head_flops, kv_cache_bytes, param_count
from rgpt_dist.models.rt import SPEC
from rgpt_dist.registry import build_model

SMALL = ["model.vocab_size=96", "model.block_size=96", "train.seq_len=64"]
V_PAD = 96


def make(*overrides, seed=0, dtype=torch.float64):
    """An rt-debug model (d 64, 4 heads, 3 layers) moved off its init (gains and all) so every
    parameter shapes the output; fp64 by default."""
    cfg = load_config("rt-debug", [*SMALL, *overrides]).model
    model = build_model(cfg, seed=seed).to(dtype)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=dtype) * (0.1 if p.dim() == 2 else 0.3))
    return cfg, model


def tokens(B, T, seed=0):
    return torch.randint(0, 96, (B, T), generator=torch.Generator().manual_seed(seed))


# ---- the reference: SPEC section 9 written out, one position at a time ---------------------------
def rms(x, gain, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gain


def layer_norm(x, sd, name, cfg):
    if cfg.norm == "rmsnorm":
        return rms(x, sd[name + ".weight"], cfg.ln_eps)
    return F.layer_norm(x, x.shape[-1:], sd[name + ".weight"], sd.get(name + ".bias"), cfg.ln_eps)


def lin(x, sd, name):
    return x @ sd[name + ".weight"].T + (sd[name + ".bias"] if name + ".bias" in sd else 0)


def reference_logits(cfg, sd, idx):
    """idx (B, T) -> logits (B, T, V): per layer l and position t, a softmax over the persistent pairs
    of positions < t and the temporary pair of t, then z_t and the persistent pair of t from z_t."""
    L, H, d = cfg.n_layer, cfg.n_head, cfg.d_model
    hd = d // H
    slopes = [2.0 ** (-8.0 * (i + 1) / H) for i in range(H)] if cfg.pos_encoding == "alibi" else [0.0] * H

    def heads(y):  # (B, d) -> (B, H, hd)
        return y.view(y.shape[0], H, hd)

    def rope(y, t):  # (B, H, hd) at position t: pair (j, j + hd/2) turns by t base^(-2j/hd)
        if cfg.pos_encoding != "rope":
            return y
        angle = t * cfg.rope_base ** (-torch.arange(0, hd, 2, dtype=y.dtype) / hd)
        cos, sin = torch.cos(angle).repeat(2), torch.sin(angle).repeat(2)
        return y * cos + torch.cat([-y[..., hd // 2:], y[..., :hd // 2]], -1) * sin

    def qk_norm(y, name):
        return rms(y, sd[name + ".weight"], cfg.ln_eps) if cfg.qk_norm else y

    def key_value(y, p):  # the layer's K, V map of an unnormed (B, d): per head, K's output [head, (k|v), hd]
        kv = lin(layer_norm(y, sd, p + "ln_1", cfg), sd, p + "kv").view(y.shape[0], H, 2, hd)
        return qk_norm(kv[:, :, 0], p + "k_norm"), kv[:, :, 1]

    x = sd["embed.wte.weight"][idx]                                    # (B, T, d)
    if cfg.pos_encoding == "learned":
        x = x + sd["embed.wpe.weight"][: idx.shape[1]]
    for l in range(L):
        p = f"layers.{l}."
        keys, values, out = [], [], []
        for t in range(idx.shape[1]):
            xt = x[:, t]
            q = rope(qk_norm(heads(lin(layer_norm(xt, sd, p + "ln_1", cfg), sd, p + "q")), p + "q_norm"), t)
            k_tmp, v_tmp = key_value(xt, p)
            k_tmp = rope(k_tmp, t)
            K = torch.stack(keys + [k_tmp], 2)                         # (B, H, t + 1, hd)
            Vv = torch.stack(values + [v_tmp], 2)
            s = torch.einsum("bhd,bhjd->bhj", q, K) / math.sqrt(hd)
            s = s - torch.tensor(slopes, dtype=s.dtype)[:, None] * torch.tensor([t - j for j in range(t)] + [0.0],
                                                                           dtype=s.dtype)
            w = torch.exp(s - s.max(-1, keepdim=True).values)
            w = w / w.sum(-1, keepdim=True)
            a = lin(torch.einsum("bhj,bhjd->bhd", w, Vv).reshape(-1, d), sd, p + "proj")
            u = layer_norm(xt + a / math.sqrt(L), sd, p + "ln_2", cfg)
            h = lin(u, sd, p + "mlp.fc")
            h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))  # GELU (tanh)
            z = xt + (a + lin(h, sd, p + "mlp.proj")) / math.sqrt(L)
            k, v = key_value(z, p)
            keys.append(rope(k, t)), values.append(v), out.append(z)
        x = torch.stack(out, 1)
    head = sd["embed.wte.weight"] if cfg.tie_embeddings else sd["embed.unembed.weight"]
    return layer_norm(x, sd, "head.ln_f", cfg) @ head.T


@pytest.mark.parametrize("overrides", [[], ["model.pos_encoding=none", "model.tie_embeddings=true",
                                            "model.bias=true", "model.norm=layernorm", "model.prefill=naive"],
                                       ["model.pos_encoding=rope", "model.qk_norm=false"]],
                         ids=["authors", "variant", "rope"])
def test_model_equals_the_reference_from_the_equations(overrides):
    cfg, model = make(*overrides)
    idx = tokens(2, 11)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    with torch.no_grad():
        got = model(idx).logits
    want = reference_logits(cfg, sd, idx)
    err = (got - want).abs().max().item()
    assert err <= 1e-13, err  # measured 2026-12-03: 4.2e-15 (authors), 2.4e-15 (variant); logits up to 2.6
    assert want.abs().max() > 0.3  # not a vanishing output


# ---- tiled = naive, outputs and gradients ----------------------------------------------------------
@pytest.fixture(scope="module")
def pair():
    """The same weights with prefill tiled and naive (fp64)."""
    _, tiled = make()
    _, naive = make("model.prefill=naive")
    naive.load_state_dict(tiled.state_dict())
    return tiled, naive


@pytest.mark.parametrize("N", [1, 2, 3, 7, 8, 33, 64])
def test_tiled_and_naive_forwards_agree_in_logits_and_gradients(pair, N):
    tiled, naive = pair
    idx, tgt = tokens(2, N, seed=N), tokens(2, N, seed=100 + N)
    grads = []
    for model in (tiled, naive):
        model.zero_grad()
        out = model(idx, tgt)
        out.loss.backward()
        grads.append((out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lt, gt), (ln, gn) = grads
    assert (lt - ln).abs().max() <= 1e-10
    assert set(gt) == set(gn) and all(g is not None for g in gt.values())
    worst = max((gt[n] - gn[n]).abs().max().item() for n in gt)
    assert worst <= 1e-10, worst  # the bound; measured 2026-12-03: <= 1.1e-15 (logits <= 4.0e-15)
    if N > 1:  # the recurrence matters: the persistent pairs' K/V weights get gradient through later positions
        assert gt["layers.0.kv.weight"].abs().max() > 0


# ---- cached decoding ----------------------------------------------------------------------------
@pytest.mark.parametrize("chunks", [[1] * 9, [5, 1, 1, 1, 1], [4, 3, 1, 1]], ids=["tokens", "prefill+tokens", "chunks"])
def test_cached_decoding_equals_recomputation(pair, chunks):
    model = pair[0].eval()
    idx = tokens(2, sum(chunks), seed=7)
    cache = model.make_cache(max_len=sum(chunks))
    with torch.no_grad():
        full = model(idx).logits
        got, start = [], 0
        for n in chunks:
            got.append(model(idx[:, start:start + n], cache=cache).logits)
            start += n
    err = (torch.cat(got, 1) - full).abs().max().item()
    assert err <= 1e-13, err  # measured 2026-12-03: 3.1-3.3e-15
    model.train()


@pytest.mark.parametrize("pos_encoding", ["alibi", "rope", "learned"])
def test_fixed_shape_decoding_equals_recomputation(pos_encoding):
    """What generate(compile_backend=...) compiles, run eagerly: a prefill, then one token per step
    at the position held in cache.slots.index, reading the whole buffers under a mask."""
    _, model = make(f"model.pos_encoding={pos_encoding}")
    model.eval()
    idx = tokens(2, 9, seed=3)
    cache = model.make_cache(max_len=9, fixed=True)
    with torch.no_grad():
        full = model(idx).logits
        got = [model(idx[:, :3], cache=cache).logits]
        cache.slots.index = torch.zeros(1, dtype=torch.long)
        for t in range(3, 9):
            cache.slots.index.fill_(t)
            mask = (torch.arange(9) <= cache.slots.index)[None, None, None]
            got.append(model(idx[:, t:t + 1], cache=cache, mask=mask,
                             positions=cache.slots.index.expand(2, 1)).logits)
    err = (torch.cat(got, 1) - full).abs().max().item()
    assert err <= 1e-13, err


def test_the_cache_holds_a_transformers_kv(pair):
    """n_layer x 2 x T x d numbers per sequence (the persistent pairs), as kv_cache_bytes counts."""
    model = pair[0].eval()
    cfg, B, T = model.cfg, 2, 13
    cache = model.make_cache(max_len=T)
    with torch.no_grad():
        model(tokens(B, 6), cache=cache)
        model(tokens(B, 7, seed=1), cache=cache)
    held = sum(t.numel() for t in cache.tensors())
    assert held == B * cfg.n_layer * 2 * T * cfg.d_model == 2 * 3 * 2 * 13 * 64
    assert cache.nbytes() == kv_cache_bytes(cfg, B, T, dtype_bytes=8)
    model.train()


# ---- FLOPs -----------------------------------------------------------------------------------------
def test_forward_flops_by_formula():
    """Eq. 1: L (24 d^2 + 4 S d) (a Transformer's) + L 4 d^2 (the persistent pair's K and V), head apart."""
    for name in ("rt-debug", "rt-150m-12l", "rt-300m-6l"):
        cfg = load_config(name, ["train.seq_len=512"]).model
        L, d = cfg.n_layer, cfg.d_model
        assert forward_flops(cfg, 512) == L * (24 * d * d + 4 * 512 * d) + L * 4 * d * d
        assert head_flops(cfg) == 2 * d * 50257


@pytest.mark.parametrize("prefill", ["tiled", "naive"])
def test_executed_flops_match_torchs_counter(prefill):
    """The counter sees the linear maps (q 2 d^2 + temporary K, V 4 d^2 per token at once; O 2 d^2,
    MLP 16 d^2 and the persistent K, V 4 d^2 per position in the step) and the scan's matmuls: tiled,
    each (query i, key j < i) pair once in a fold (scores and values: 4 d per pair); naive, each query
    against its persistent keys and its temporary one. The temporary pair's score in the tiled scan
    is elementwise, which the counter does not count."""
    cfg, model = make(f"model.prefill={prefill}", dtype=torch.float32)
    B, S, L, d = 2, 40, cfg.n_layer, cfg.d_model
    pairs = S * (S - 1) // 2 if prefill == "tiled" else S * (S + 1) // 2
    expected = B * (S * (L * 28 * d * d + 2 * d * V_PAD) + L * 4 * d * pairs)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(tokens(B, S))
    assert counter.get_total_flops() == expected
    assert B * S * (executed_forward_flops(cfg, S) + head_flops(cfg)) == pytest.approx(expected, rel=1e-12)


# ---- parameters, flavours, refusals --------------------------------------------------------------
def test_flavours_and_their_dense_partners():
    """The authors' shapes, head_dim 64; each dense partner has the same shape and block options, and
    RT its parameters plus the untied head (V_padded x d)."""
    shapes = {"rt-150m-12l": (12, 1024), "rt-150m-6l": (6, 1408), "rt-300m-24l": (24, 1024),
              "rt-300m-12l": (12, 1408), "rt-300m-6l": (6, 2048)}
    for name, (L, d) in shapes.items():
        rt = load_config(name, []).model
        dense = load_config(SPEC.dense_reference[name], []).model
        assert (rt.n_layer, rt.d_model, rt.head_dim, rt.vocab_size) == (L, d, 64, 50257) and not rt.tie_embeddings
        assert dense.family == "gpt2" and (dense.n_layer, dense.d_model, dense.n_head) == (L, d, rt.n_head)
        for option in ("bias", "norm", "qk_norm", "pos_encoding", "mlp", "d_ff"):
            assert getattr(dense, option) == getattr(rt, option), option
        assert param_count(rt) - param_count(dense) == 50257 * d


def test_parameter_count_of_the_built_model():
    for overrides in ([], ["model.tie_embeddings=true"]):
        cfg, model = make(*overrides)
        assert param_count(cfg) == sum(p.numel() for p in model.parameters())
        dense = load_config("rt-dense-debug", SMALL).model
        assert param_count(cfg) - param_count(dense) == (0 if cfg.tie_embeddings else V_PAD * 64)


@pytest.mark.parametrize("override, message", [
    ("model.prefill=fast", "model.prefill"),
    ("model.mup_base_width=32", "model.mup_base_width=32 is not supported by RT"),
    ("model.n_layer=0", "model.n_layer=0 must be >= 1"),
    ("parallel.compile=model", "parallel.compile=model is not supported by model family 'rt'"),
])
def test_config_refusals_name_the_value(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("rt-debug", [*SMALL, override])


def test_forward_and_cache_refusals(pair):
    model = pair[0]
    idx = tokens(1, 4)
    with pytest.raises(ValueError, match="r=2"):
        model(idx, r=2)
    with pytest.raises(ValueError, match="padded batches"):
        model(idx, mask=torch.ones(1, 1, 4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="'first'"):
        model.make_cache("first")
    with pytest.raises(ValueError, match="r=1 is not supported"):
        model.make_cache("full", 1)
    cache = model.eval().make_cache(max_len=8)  # a mask without a fixed-shape step: a padded batch
    with torch.no_grad(), pytest.raises(ValueError, match="padded batches"):
        model(idx, cache=cache, positions=torch.arange(4)[None])
    model.train()


# ---- training through the real trainer ---------------------------------------------------------------
def test_trains_through_the_launcher_and_the_loss_falls(dataset, tmp_path):
    """One rank of launcher.train (ZeRO-2, fp32, each RT layer an activation-checkpointing unit: `recurrence`)
    on the session's tokenized source: the training loss falls over 8 steps of 8 x 32 tokens (the
    tiled scan's backward is the one training runs)."""
    from tests.helpers.runs import BASE, train

    recs = train(1, tmp_path / "run", dataset, "model=rt-debug", "train.max_steps=8", "eval.every_steps=0",
                 "checkpoint.every_steps=8", common=BASE, config="configs/experiments/gpt2-small-20k.yaml")
    losses = [r["loss"] for r in recs if "loss" in r and r.get("step", 0) >= 1]
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses)
    # measured 2026-12-03: 10.83, 10.68, 10.42, 10.42, 10.12, 9.99, 9.82, 9.98 (the means of the first and
    # last three differ by 0.71)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.4, losses
