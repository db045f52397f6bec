"""Mixture-of-Recursions against an independent re-implementation of its equations
(tests/models/reference.py, fp64, one sequence at a time): the routes (selected-token sets), the
logits, the auxiliary BCE loss and the gradients of training's top-k routing; causal threshold
routing at inference; recursion-wise KV caching; FLOPs from the routed token counts (#14)."""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.flops import executed_forward_flops, forward_flops, head_flops, train_flops
from rgpt_dist.models.mor.config import MoRConfig
from rgpt_dist.models.mor.model import MixtureOfRecursionsGPT
from tests.models import reference

CFG = dict(vocab_size=300, block_size=64, d_model=48, n_head=4, n_pre=1, n_rec=2, n_coda=1, n_loops=3,
           router_aux_coef=0.05)


def make(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = MoRConfig(**{**CFG, **overrides})
    model = MixtureOfRecursionsGPT(cfg).double()
    with torch.no_grad():  # off the init: non-trivial LayerNorms and biases, router scores spread
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        model.recurrence.router.weight.mul_(30)
    return model, cfg


def batch(cfg, B=2, T=20, seed=1):
    idx = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(seed))
    return idx[:, :-1], idx[:, 1:]


def routes_of(model):
    """A list the recursion's hook fills with each step's selected positions, [step][row] -> list."""
    routes = []

    def hook(_, __, out):
        sel = out[0][1]
        routes.append([torch.nonzero(row).flatten().tolist() for row in sel])
    model.recurrence.register_forward_hook(hook)
    return routes


def ce(logits, targets, cfg):
    return torch.nn.functional.cross_entropy(logits[..., :cfg.vocab_size].flatten(0, 1), targets.flatten())


@pytest.mark.parametrize("r", [1, 2, 3])
def test_training_routes_loss_and_gradients_match_reference(r):
    model, cfg = make()
    idx, tgt = batch(cfg)
    routes = routes_of(model)
    out = model.train()(idx, tgt, r=r)
    sd = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    logits, aux, ref_routes = reference.mor_forward(sd, cfg, idx, r, "top_k")
    assert routes == ref_routes
    assert [len(rt[0]) for rt in routes] == [math.ceil((3 - i) / 3 * 20) for i in range(r)]  # 20, 14, 7
    assert (out.logits - logits).abs().max() < 1e-10
    assert abs(out.aux["aux_loss"].item() - aux.item()) < 1e-10
    (out.loss + out.aux["aux_loss"]).backward()
    (ce(logits, tgt, cfg) + aux).backward()
    for name, p in model.named_parameters():
        assert (p.grad - sd[name].grad).abs().max() < 1e-10, name
    assert model.recurrence.router.weight.grad[:r].abs().min() > 0  # each router is trained (through g)


@pytest.mark.parametrize("routing", ["threshold", "top_k"])
def test_inference_routing_matches_reference(routing):
    """threshold: causal routes (a candidate kept where its own score > 0), computed on every token
    with the unselected masked out as keys; top_k: the training routes, in eval mode."""
    model, cfg = make(inference_routing=routing)
    idx, _ = batch(cfg, T=24)
    routes = routes_of(model)
    with torch.no_grad():
        got = model.eval()(idx).logits
        logits, _, ref_routes = reference.mor_forward(model.state_dict(), cfg, idx, 3, routing)
    assert routes == ref_routes
    assert (got - logits).abs().max() < 1e-10
    if routing == "threshold":  # the routes differ between rows and are nested
        assert len(routes[2][0]) != len(routes[2][1]) or routes[2][0] != routes[2][1]
        assert all(set(routes[i + 1][b]) <= set(routes[i][b]) for i in range(2) for b in range(2))
        assert 0 < len(routes[2][0]) < 24


@pytest.mark.parametrize("train", [True, False])
def test_token_choice_matches_reference(train):
    """Token choice: each token's depth (argmax + 1 of softmax(W h^(0))) and update scale, the
    balancing loss, the logits and (training) every gradient; the same routes in eval mode."""
    model, cfg = make(routing="token")
    idx, tgt = batch(cfg, T=24)
    routes = routes_of(model)
    out = model.train(train)(idx, tgt)
    sd = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    logits, aux, ref_routes = reference.mor_forward(sd, cfg, idx, 3, "token")
    assert routes == ref_routes and len({len(r) for step in routes for r in step}) > 2  # depths vary
    assert (out.logits - logits).abs().max() < 1e-10
    assert abs(out.aux["aux_loss"].item() - aux.item()) < 1e-10
    if train:
        (out.loss + out.aux["aux_loss"]).backward()
        (ce(logits, tgt, cfg) + aux).backward()
        for name, p in model.named_parameters():
            assert (p.grad - sd[name].grad).abs().max() < 1e-10, name


def test_threshold_routing_is_causal():
    """A token's logits do not change when later tokens do (top-k's would)."""
    model, cfg = make()
    idx, _ = batch(cfg, T=24)
    other = idx.clone()
    other[:, 12:] = (other[:, 12:] + 7) % cfg.vocab_size
    with torch.no_grad():
        a, b = model.eval()(idx).logits, model(other).logits
    torch.testing.assert_close(a[:, :12], b[:, :12], atol=1e-12, rtol=0)


@pytest.mark.parametrize("routing", ["expert", "token"])
@torch.no_grad()
def test_recursion_wise_cache_equals_the_uncached_forward(routing):
    """Chunks of 6, 1, 3, 1, 1 tokens through the static cache and the dynamic one: the logits of
    the whole-sequence causal forward (a cached token sees exactly the keys each recursion kept);
    `last` and `average` are refused."""
    from tests.models.test_kv_cache import CHUNKS, decode, split

    model, cfg = make(routing=routing)
    model.eval()
    idx, _ = batch(cfg, T=sum(CHUNKS))
    full = model(idx).logits
    for cache in (model.make_cache(), model.make_cache(store=lambda: __import__(
            "rgpt_dist.models.kv_cache", fromlist=["LayerCache"]).LayerCache())):
        got = torch.cat(decode(model, split(idx), cache), dim=1)
        assert (got - full).abs().max() < 1e-10
    with pytest.raises(ValueError, match="recursion-wise"):
        model.make_cache("average")


@torch.no_grad()
def test_shared_first_recursion_cache():
    """Recursive KV sharing (`first`): the prompt is exact (it attends within itself); a later
    token attends, at every recursion, to the earlier tokens' first-recursion K/V, which every
    token has (their routes in the cache are all ones), so it differs from recursion-wise caching."""
    model, cfg = make()
    model.eval()
    idx, _ = batch(cfg, T=12)
    full, shared = model.make_cache("full"), model.make_cache("first")
    a, b = model(idx[:, :8], cache=full).logits, model(idx[:, :8], cache=shared).logits
    assert (a - b).abs().max() < 1e-10
    route_store = shared.core[0][-1].store
    assert bool((route_store.keys == 1).all()) and route_store.keys.shape == (2, 1, 8, 1)
    later_full, later_shared = model(idx[:, 8:9], cache=full).logits, model(idx[:, 8:9], cache=shared).logits
    assert (later_full - later_shared).abs().max() > 1e-6
    assert shared.nbytes() < full.nbytes()
    with pytest.raises(ValueError, match="top-k routing"):
        make(inference_routing="top_k")[0].eval()(idx[:, :4], cache=model.make_cache())


def test_beyond_n_nothing_runs_and_zero_is_the_prelude():
    model, cfg = make()
    idx, tgt = batch(cfg)
    with torch.no_grad():
        model.eval()
        torch.testing.assert_close(model(idx, r=5).logits, model(idx, r=3).logits, atol=0, rtol=0)
        out = model.train()(idx, tgt, r=5, stats=True)
    assert out.aux["stats"]["routed_frac"].tolist()[3:] == [0.0, 0.0]


def counted_training_forward(*overrides):
    """The debug flavour (S = 64) with `overrides`: (config, matmul FLOPs torch's counter sees in a
    training forward of 2 x 64 tokens, the spec's executed FLOPs for them)."""
    from rgpt_dist.registry import build_model

    cfg = load_config("mor-debug", ["model.vocab_size=512", "model.block_size=64", "model.pad_vocab_multiple=64",
                                    "train.seq_len=64", *overrides]).model
    model = build_model(cfg, seed=0).train()
    idx = torch.randint(0, cfg.vocab_size, (2, 64))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        model(idx)
    return cfg, counter.get_total_flops(), idx.numel() * (executed_forward_flops(cfg, 64) + head_flops(cfg))


def test_flops_count_the_routed_tokens():
    """Executed FLOPs of a training forward (torch's counter, the gathered recursions) equal the
    spec's: recursion i runs ceil(c_i T) tokens whose attention spans only them."""
    cfg, counted, expected = counted_training_forward("model.n_loops=4")
    assert counted == pytest.approx(expected, rel=1e-9)
    d, S = cfg.d_model, 64
    routed = sum(c * (24 * d * d + 4 * c * S * d) for c in (1, 0.75, 0.5, 0.25))
    assert forward_flops(cfg, S) == pytest.approx(2 * (24 * d * d + 4 * S * d) + routed + 4 * 2 * d)
    assert train_flops(cfg, S) == pytest.approx(3 * (forward_flops(cfg, S) + head_flops(cfg)))


def test_token_choice_flops_are_every_recursion_on_every_token():
    cfg, counted, expected = counted_training_forward("model.routing=token")
    assert counted == pytest.approx(expected, rel=1e-9)
    assert forward_flops(cfg, 64) == pytest.approx((2 + 3) * (24 * 64 ** 2 + 4 * 64 * 64) + 2 * 64 * 3)


def test_config_is_validated():
    with pytest.raises(ConfigError, match="inference_routing='causal'"):
        load_config("mor-debug", ["model.inference_routing=causal"])
    with pytest.raises(ConfigError, match="routing='both'"):
        load_config("mor-debug", ["model.routing=both"])
    with pytest.raises(ConfigError, match="router_alpha=0.0 must be > 0"):
        load_config("mor-debug", ["model.router_alpha=0"])
