"""KV caches (rgpt_dist.models.kv_cache): cached decoding equals full recomputation with `full`,
the compressed strategies equal a naive hand-written reference, and the memory accounting is exact."""
import pytest
import torch

from rgpt_dist.config import GPT2Config, RecurrentGPTConfig
from rgpt_dist.models.gpt2.model import GPT2
from rgpt_dist.flops import kv_cache_bytes
from rgpt_dist.models.kv_cache import STRATEGIES
from rgpt_dist.models.recurrent_gpt.model import RecurrentGPT
from tests.models import reference

R = 3
RGPT = dict(vocab_size=300, block_size=48, d_model=48, n_head=4, n_pre=1, n_rec=2, n_coda=2, n_loops=R)
DENSE = dict(vocab_size=300, block_size=48, d_model=48, n_head=4, n_layer=3)
CHUNKS = (6, 1, 3, 1, 1)  # a prefill, then single tokens and a multi-token chunk after a past


def randomise_(model):
    """Off the init: non-trivial LayerNorms and biases, gate bias ~N(0, 1) so both gate branches count."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        if isinstance(model, RecurrentGPT):
            model.recurrence.gate_out.bias.normal_(0.0, 1.0)


def make(family="recurrent_gpt", seed=0, dtype=torch.float32, **overrides):
    torch.manual_seed(seed)
    if family == "gpt2":
        model = GPT2(GPT2Config(**{**DENSE, **overrides}))
    else:
        model = RecurrentGPT(RecurrentGPTConfig(**{**RGPT, **overrides}))
    randomise_(model)
    return model.to(dtype).eval(), model.cfg


def tokens(cfg, T, B=2, seed=1):
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def split(idx, sizes=CHUNKS):
    return list(torch.split(idx, list(sizes), dim=1))


@torch.no_grad()
def decode(model, chunks, cache, **kw):
    return [model(c, cache=cache, **kw).logits for c in chunks]


@torch.no_grad()
def test_gpt2_cached_logits_equal_full_sequence():
    model, cfg = make("gpt2")
    idx = tokens(cfg, sum(CHUNKS))
    full = model(idx).logits
    cache = model.make_cache()
    got = torch.cat(decode(model, split(idx), cache), dim=1)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=0)
    assert cache.length == idx.shape[1] and full.abs().max() > 0.1


@pytest.mark.parametrize("r", [0, 1, R, 2 * R])
@torch.no_grad()
def test_recurrent_full_cache_equals_full_sequence(r):
    model, cfg = make()
    idx = tokens(cfg, sum(CHUNKS))
    full = model(idx, r=r).logits
    cache = model.make_cache("full", r)
    got = torch.cat(decode(model, split(idx), cache, r=r), dim=1)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=0)
    assert cache.length == idx.shape[1] and full.abs().max() > 0.1


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("r", [0, 1, 2, 2 * R])
def test_strategies_equal_naive_reference(strategy, r):
    """fp64, so a wrong mask, position or stored step cannot hide under the tolerance."""
    model, cfg = make(dtype=torch.float64)
    chunks = split(tokens(cfg, sum(CHUNKS)))
    got = decode(model, chunks, model.make_cache(strategy, r), r=r)
    with torch.no_grad():
        want = reference.recurrent_gpt_cached_logits(model.state_dict(), cfg, chunks, r, strategy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=0)


@torch.no_grad()
def test_compressed_strategies_are_exact_on_prefill_and_differ_afterwards():
    model, cfg = make()
    chunks = split(tokens(cfg, 9), (6, 1, 1, 1))
    logits = {s: decode(model, chunks, model.make_cache(s, R), r=R) for s in STRATEGIES}
    for s in STRATEGIES:
        torch.testing.assert_close(logits[s][0], logits["full"][0], atol=1e-6, rtol=0)
    for a in STRATEGIES:
        for b in STRATEGIES:
            if a < b:
                assert (logits[a][-1] - logits[b][-1]).abs().max() > 1e-3, (a, b)


def held_storage_bytes(cache):
    tensors = cache.tensors()
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == len(tensors)  # no shared storage
    return sum(t.untyped_storage().nbytes() for t in tensors)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("r", [0, 1, R, 2 * R])
def test_nbytes_is_what_is_held_and_matches_the_formula(r, strategy, dtype):
    model, cfg = make(dtype=dtype)
    cache = model.make_cache(strategy, r)
    chunks = split(tokens(cfg, sum(CHUNKS), B=3))
    decode(model, chunks[:1], cache, r=r)
    assert cache.nbytes() == held_storage_bytes(cache) > 0  # the prefill's K/V is not a view of qkv
    decode(model, chunks[1:], cache, r=r)
    T = sum(CHUNKS)
    assert cache.nbytes() == held_storage_bytes(cache) > 0
    assert cache.nbytes() == kv_cache_bytes(cfg, 3, T, strategy, r, dtype.itemsize)
    assert len(cache.tensors()) == 2 * (cfg.n_pre + cfg.n_coda + cfg.n_rec * (r if strategy == "full" else min(r, 1)))


def test_dense_nbytes_and_full_over_compressed_ratio():
    model, cfg = make("gpt2")
    cache = model.make_cache()
    decode(model, split(tokens(cfg, 8, B=1), (7, 1)), cache)
    assert cache.nbytes() == held_storage_bytes(cache) == kv_cache_bytes(cfg, 1, 8, "full", None, 4)
    assert cache.nbytes() == cfg.n_layer * 2 * 8 * cfg.d_model * 4
    big = RecurrentGPTConfig(**{**RGPT, "d_model": 1024, "n_head": 16, "n_pre": 2, "n_rec": 5, "n_coda": 2})
    for r in (1, 4, 8):
        ratio = kv_cache_bytes(big, 32, 1024, "full", r, 2) / kv_cache_bytes(big, 32, 1024, "average", r, 2)
        assert ratio == pytest.approx((2 + 2 + 5 * r) / (2 + 2 + 5))
    assert kv_cache_bytes(big, 1, 1024, "first", 4, 2) == (2 + 2 + 5) * 2 * 1024 * 1024 * 2


@torch.no_grad()
def test_measured_full_over_average_ratio():
    model, cfg = make()
    held = {}
    for s in ("full", "average"):
        cache = model.make_cache(s, 2 * R)
        decode(model, split(tokens(cfg, 7), (6, 1)), cache, r=2 * R)
        held[s] = cache.nbytes()
    assert held["full"] / held["average"] == pytest.approx(
        (cfg.n_pre + cfg.n_coda + cfg.n_rec * 2 * R) / (cfg.n_pre + cfg.n_coda + cfg.n_rec))


@torch.no_grad()
def test_errors_leave_the_cache_unchanged():
    model, cfg = make()
    cache = model.make_cache("full", R)
    model(tokens(cfg, cfg.block_size - 1), cache=cache, r=R)
    before = cache.nbytes()
    with pytest.raises(ValueError, match="block_size=48"):
        model(tokens(cfg, 2), cache=cache, r=R)
    with pytest.raises(ValueError, match="made for depth r=3, got r=4"):
        model(tokens(cfg, 1), cache=cache, r=4)
    with pytest.raises(ValueError, match="made for depth r=4, got r=3"):
        model(tokens(cfg, 1), cache=model.make_cache("average", 4))  # r=None means R
    assert cache.length == cfg.block_size - 1 and cache.nbytes() == before
    model(tokens(cfg, 1), cache=cache, r=R)  # the last position still fits
    with pytest.raises(ValueError, match="block_size"):
        model(tokens(cfg, cfg.block_size + 1), cache=model.make_cache())


def test_invalid_uses():
    model, cfg = make()
    dense, _ = make("gpt2")
    for m in (model, dense):
        with pytest.raises(ValueError, match="unknown KV-cache strategy 'mean'"):
            m.make_cache("mean")
    with pytest.raises(ValueError, match="unknown KV-cache strategy"):
        kv_cache_bytes(cfg, 1, 8, "none", 1, 2)
    with pytest.raises(ValueError, match="r is not supported"):
        dense.make_cache("full", 2)
    idx = tokens(cfg, 4)
    with pytest.raises(ValueError, match="all_exits"):
        model(idx, idx, all_exits=True, cache=model.make_cache())
    for m in (model, dense):
        m.train()
        with pytest.raises(ValueError, match="inference"):
            m(idx, cache=m.make_cache())
