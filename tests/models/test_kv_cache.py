"""KV caches (rgpt_dist.models.kv_cache): cached decoding equals full recomputation with `full`,
the compressed strategies equal a naive hand-written reference, the static (preallocated) cache
equals the dynamic (torch.cat) one for every family and strategy, is allocated once and written
in place, and the memory accounting is exact."""
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rgpt_dist.config import GPT2Config, RecurrentGPTConfig, load_config
from rgpt_dist.models.gpt2.model import GPT2
from rgpt_dist.flops import kv_cache_bytes
from rgpt_dist.models.kv_cache import STRATEGIES, KVCache, StaticLayerCache
from rgpt_dist.models.recurrent_gpt.model import RecurrentGPT
from rgpt_dist.models.spec import families, spec_for
from rgpt_dist.registry import build_model
from tests.helpers.tolerance import fp32_bound, max_abs
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


def dynamic_cache(model, strategy="full", r=None):
    """The cache make_cache builds, with dynamic (torch.cat) storage: the pre-static behaviour, and
    what the Hugging Face export still uses (DynamicLayer stores)."""
    static = model.make_cache(strategy, r)
    n_core = len(static.core[0]) if static.core else 0
    return KVCache(len(static.layers), n_core, strategy, static.r, static.block_size)


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


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("r", [0, 1, 2, 2 * R])
def test_strategies_equal_naive_reference(strategy, r, static):
    """fp64, so a wrong mask, position or stored step cannot hide under the tolerance."""
    model, cfg = make(dtype=torch.float64)
    chunks = split(tokens(cfg, sum(CHUNKS)))
    cache = model.make_cache(strategy, r) if static else dynamic_cache(model, strategy, r)
    got = decode(model, chunks, cache, r=r)
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


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("r", [0, 1, R, 2 * R])
def test_nbytes_is_what_is_held_and_matches_the_formula(r, strategy, dtype, static):
    """Dynamic: the tokens held. Static: the capacity (here exactly the tokens fed), from the prefill on."""
    model, cfg = make(dtype=dtype)
    T = sum(CHUNKS)
    cache = model.make_cache(strategy, r, max_len=T) if static else dynamic_cache(model, strategy, r)
    chunks = split(tokens(cfg, T, B=3))
    decode(model, chunks[:1], cache, r=r)
    assert cache.nbytes() == held_storage_bytes(cache) > 0  # the prefill's K/V is not a view of qkv
    if static:
        assert cache.nbytes() == kv_cache_bytes(cfg, 3, T, strategy, r, dtype.itemsize)
    decode(model, chunks[1:], cache, r=r)
    assert cache.nbytes() == held_storage_bytes(cache) > 0
    assert cache.nbytes() == kv_cache_bytes(cfg, 3, T, strategy, r, dtype.itemsize)
    assert len(cache.tensors()) == 2 * (cfg.n_pre + cfg.n_coda + cfg.n_rec * (r if strategy == "full" else min(r, 1)))


def test_dense_nbytes_and_full_over_compressed_ratio():
    model, cfg = make("gpt2")
    for cache in (model.make_cache(max_len=8), dynamic_cache(model)):
        decode(model, split(tokens(cfg, 8, B=1), (7, 1)), cache)
        assert cache.nbytes() == held_storage_bytes(cache) == kv_cache_bytes(cfg, 1, 8, "full", None, 4)
    cache = model.make_cache()  # capacity block_size by default
    decode(model, split(tokens(cfg, 8, B=1), (7, 1)), cache)
    assert cache.max_len == cfg.block_size
    assert cache.nbytes() == kv_cache_bytes(cfg, 1, cfg.block_size, "full", None, 4)
    assert cache.nbytes() == cfg.n_layer * 2 * cfg.block_size * cfg.d_model * 4
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


# ---- static (preallocated) storage ----------------------------------------------------------------

FAMILY_OVERRIDES = ["model.vocab_size=512", "model.block_size=64", "model.pad_vocab_multiple=64", "train.seq_len=64"]
_FAMILY_MODELS: dict = {}


def family_model(name):
    """Each registered family's debug flavour (as tests/models/test_family_contract.py builds it),
    off the init (RRT's LoRA B starts at zero); built once per session."""
    if name not in _FAMILY_MODELS:
        spec = spec_for(name)
        cfg = load_config(next(f for f in spec.flavours if f.endswith("-debug")), FAMILY_OVERRIDES).model
        model = build_model(cfg, seed=0).eval()
        torch.manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        _FAMILY_MODELS[name] = (model, cfg, spec)
    return _FAMILY_MODELS[name]


def family_cases():
    """(family, strategy, r): every strategy at depths 0, 1 and R for prelude/core/coda families;
    dense models have one cache (strategy `full`, r None)."""
    cases = []
    for name in sorted(families()):
        if not spec_for(name).cached_generation:  # declared: the contract checks the refusal
            continue
        if not spec_for(name).recurrent:
            cases.append((name, "full", None))
            continue
        cases += [(name, s, r) for s in spec_for(name).kv_strategies for r in (0, 1, "R")]
    return cases




@pytest.mark.parametrize("name,strategy,r", family_cases())
@torch.no_grad()
def test_static_equals_dynamic_and_uncached_for_every_family(name, strategy, r):
    """The static cache computes what the dynamic one computed (to float rounding: attention reads
    strided views of the buffers); `full` equals the uncached forward on every chunk, a compressed
    strategy on the prefill (it attends exactly within one forward). "To float rounding" is
    tests/helpers/tolerance.py's bound from the uncached forward's own distance from a float64 forward
    of the same weights (RLT's carried state compounds rounding along the sequence: 1.45e-5 on logits
    up to 9.2 on one CPU, 1.05e-5 on another, 2.7e-15 in fp64)."""
    model, cfg, spec = family_model(name)
    r = spec.default_depth(cfg) if r == "R" else r
    kw = {} if r is None else {"r": r}
    idx = tokens(cfg, sum(CHUNKS))
    static = model.make_cache(strategy, r)
    got = decode(model, split(idx), static, **kw)
    want = decode(model, split(idx), dynamic_cache(model, strategy, r), **kw)
    full = model(idx, **kw).logits
    exact = copy.deepcopy(model).double()(idx, **kw).logits
    bound = fp32_bound(max_abs(full, exact), exact.abs().max().item())
    for g, w in zip(got, want):
        assert max_abs(g, w) <= bound, (max_abs(g, w), bound)
    if strategy == "full":
        assert max_abs(torch.cat(got, dim=1), full) <= bound, (max_abs(torch.cat(got, dim=1), full), bound)
    assert max_abs(got[0], full[:, :CHUNKS[0]]) <= bound, (max_abs(got[0], full[:, :CHUNKS[0]]), bound)
    assert static.length == idx.shape[1] and full.abs().max() > 0.1
    assert all(isinstance(s, StaticLayerCache) and s.length == idx.shape[1] for s in static.stores())


def buffer_ids(cache):
    return [(id(t), t.data_ptr()) for t in cache.tensors()]


@pytest.mark.parametrize("strategy", STRATEGIES)
@torch.no_grad()
def test_buffers_are_allocated_once_and_written_in_place(strategy):
    model, cfg = make()
    cache = model.make_cache(strategy, R, max_len=20)
    idx = tokens(cfg, 12)
    assert cache.tensors() == [] and cache.nbytes() == 0  # allocated lazily, by the first forward
    model(idx[:, :6], cache=cache, r=R)
    allocated, nbytes = buffer_ids(cache), cache.nbytes()
    head_dim = cfg.d_model // cfg.n_head
    assert all(t.shape == (2, cfg.n_head, 20, head_dim) for t in cache.tensors())
    for t in range(6, 12):
        model(idx[:, t:t + 1], cache=cache, r=R)
        assert buffer_ids(cache) == allocated and cache.nbytes() == nbytes
    for store in cache.stores():  # what is held is a view of the buffers
        assert store.keys.shape[2] == 12 and store.keys.data_ptr() == store.k_buf.data_ptr()
        assert store.values.untyped_storage().data_ptr() == store.v_buf.untyped_storage().data_ptr()


class Ops(TorchDispatchMode):
    """Records every aten op run inside it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family,strategy", [("gpt2", "full")] + [("recurrent_gpt", s) for s in STRATEGIES])
@torch.no_grad()
def test_a_decode_step_concatenates_nothing_and_attends_to_the_buffers(family, strategy, monkeypatch):
    model, cfg = make(family)
    kw = {} if family == "gpt2" else {"r": R}
    r = kw.get("r")
    idx = tokens(cfg, 7)
    for cache in (model.make_cache(strategy, r), dynamic_cache(model, strategy, r)):
        model(idx[:, :6], cache=cache, **kw)
        with Ops() as seen:
            model(idx[:, 6:], cache=cache, **kw)
        # dynamic storage copies the whole past once per layer and step (the detector sees it)
        static = isinstance(cache.layers[0], StaticLayerCache)
        assert ("cat" in seen.ops) != static
    keys, sdpa = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, **a: keys.append(k) or sdpa(q, k, v, **a))
    cache = model.make_cache(strategy, r)
    model(idx[:, :6], cache=cache, **kw)
    keys.clear()
    model(idx[:, 6:], cache=cache, **kw)
    buffers = {t.untyped_storage().data_ptr() for t in cache.tensors()}
    assert keys and all(k.untyped_storage().data_ptr() in buffers and k.shape[2] == 7 for k in keys)


@torch.no_grad()
def test_overflow_names_the_capacity_and_leaves_the_cache_unchanged():
    model, cfg = make()
    for strategy in ("full", "average"):
        cache = model.make_cache(strategy, R, max_len=8)
        model(tokens(cfg, 6), cache=cache, r=R)
        held = lambda: [t.clone() for s in cache.stores() for t in (s.keys, s.values)]  # noqa: E731
        before = held()
        with pytest.raises(ValueError, match="holds 6 tokens; 3 more exceed its capacity max_len=8"):
            model(tokens(cfg, 3), cache=cache, r=R)
        assert cache.length == 6 and all(torch.equal(a, b) for a, b in zip(held(), before))
        model(tokens(cfg, 2), cache=cache, r=R)  # fills it exactly
        with pytest.raises(ValueError, match="max_len=8"):
            model(tokens(cfg, 1), cache=cache, r=R)
    store = StaticLayerCache(4)  # a store on its own checks too
    k = torch.zeros(1, 2, 3, 8)
    store.update(k, k)
    with pytest.raises(ValueError, match="capacity max_len=4 holds 3 tokens; 3 more do not fit"):
        store.update(k, k)
    with pytest.raises(ValueError, match="do not fit this cache's buffers"):
        store.update(torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8))  # another batch size


def test_invalid_capacities():
    model, cfg = make()
    dense, _ = make("gpt2")
    for m, r in ((model, R), (dense, None)):
        for bad in (0, cfg.block_size + 1):
            with pytest.raises(ValueError, match=rf"max_len={bad} must be in \[1, block_size=48\]"):
                m.make_cache("full", r, max_len=bad)
    with pytest.raises(ValueError, match="either max_len"):
        KVCache(2, max_len=4, store=list)
