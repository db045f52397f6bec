"""generate(): cached greedy decoding equals recomputing the whole prefix each token; sampling,
eos handling and mode restoration."""
import pytest
import torch

from rgpt_dist.models.generate import generate, sample_next
from rgpt_dist.models.kv_cache import STRATEGIES
from tests.models.test_kv_cache import R, tokens
from tests.models.test_kv_cache import make as make_small

NEW = 16


def make(family="recurrent_gpt"):
    """A seeded random model with weight matrices perturbed by N(0, 0.2^2): its greedy stream varies
    from the first tokens (at init it repeats one token)."""
    model, cfg = make_small(family)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.add_(torch.randn_like(p) * 0.2)
    return model, cfg


def assert_varied(out, prompt_len):
    assert len(set(out[:, prompt_len:].flatten().tolist())) > NEW // 2  # not a constant (degenerate) stream


def test_gpt2_cached_greedy_equals_uncached():
    model, cfg = make("gpt2")
    prompt = tokens(cfg, 5)
    cached = generate(model, prompt, NEW)
    assert torch.equal(cached, generate(model, prompt, NEW, strategy=None))
    assert cached.shape == (2, 5 + NEW) and torch.equal(cached[:, :5], prompt)
    assert_varied(cached, 5)


@pytest.mark.parametrize("r", [None, 0, 1, 2 * R])
def test_recurrent_full_cache_greedy_equals_uncached(r):
    model, cfg = make()
    prompt = tokens(cfg, 5)
    cached = generate(model, prompt, NEW, r=r, strategy="full")
    assert torch.equal(cached, generate(model, prompt, NEW, r=r, strategy=None))
    assert cached.shape == (2, 5 + NEW)
    assert_varied(cached, 5)


def test_compressed_strategies_share_the_first_token_then_may_diverge():
    model, cfg = make()
    prompt = tokens(cfg, 8)
    outs = {s: generate(model, prompt, NEW, strategy=s) for s in STRATEGIES}
    assert_varied(outs["full"], 8)  # a constant stream would make "the same first token" vacuous
    for s in STRATEGIES:  # the first new token comes from the exact prefill
        assert torch.equal(outs[s][:, :9], outs["full"][:, :9])
    assert any(not torch.equal(outs[s], outs["full"]) for s in ("first", "last", "average"))


def test_sampling_is_reproducible_and_top_k_1_is_greedy():
    model, cfg = make()
    prompt = tokens(cfg, 4)

    def sample(seed, **kw):
        return generate(model, prompt, NEW, temperature=1.0, generator=torch.Generator().manual_seed(seed), **kw)
    assert torch.equal(sample(0), sample(0))
    assert not torch.equal(sample(0), sample(1))
    greedy = generate(model, prompt, NEW)
    assert_varied(greedy, 4)  # top_k=1 equal to a varied greedy stream, not to one repeated token
    assert torch.equal(sample(3, top_k=1), greedy)


def test_top_k_restricts_the_support():
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]]).repeat(500, 1)
    draws = sample_next(logits, temperature=2.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(draws.flatten().tolist()) == {1, 2}


def test_eos_stops_and_pads():
    model, cfg = make()
    prompt = tokens(cfg, 5)
    free = generate(model, prompt, NEW)[:, 5:]                            # (2, NEW) without eos
    eos = int(free[0, 3])                                                 # row 0's fourth new token
    expected, stops = free.clone(), []
    for row in range(2):
        hits = (free[row] == eos).nonzero().flatten().tolist()
        stops.append(hits[0] + 1 if hits else NEW)
        expected[row, stops[-1]:] = eos                                   # finished rows are padded
    out = generate(model, prompt, NEW, eos_token_id=eos)
    assert torch.equal(out[:, 5:], expected[:, :max(stops)])             # stops once every row is done
    assert generate(model, prompt[:1], NEW, eos_token_id=eos).shape == (1, 5 + stops[0])
    assert stops[0] < NEW and max(stops) > stops[0]  # (this seed) row 0 stops early, row 1 later


def test_mode_restored_and_block_size_checked():
    model, cfg = make()
    model.train()
    generate(model, tokens(cfg, 4), 2)
    assert model.training
    generate(model, tokens(cfg, cfg.block_size - 3), 4)  # the 4th new token is never fed back
    with pytest.raises(ValueError, match="block_size=48"):
        generate(model, tokens(cfg, cfg.block_size - 3), 5)


def captured(model, monkeypatch):
    """Every cache `model.make_cache` returns (generate() makes one and does not return it), and
    after each forward on it, the (id, data_ptr) of its K/V buffers."""
    made, after = [], []
    original = model.make_cache
    monkeypatch.setattr(model, "make_cache", lambda *a, **k: made.append(original(*a, **k)) or made[-1])
    model.register_forward_hook(lambda *_: after.append([(id(t), t.data_ptr()) for t in made[-1].tensors()]))
    return made, after


@torch.no_grad()
def greedy_dynamic(model, prompt, n, strategy, r=None):
    """Greedy decoding with the dynamic (torch.cat) cache: generate()'s behaviour before the static one."""
    from tests.models.test_kv_cache import dynamic_cache

    cache, out, new = dynamic_cache(model, strategy, r), prompt, prompt
    for _ in range(n):
        new = model(new, cache=cache, **({} if r is None else {"r": r})).logits[:, -1, :model.cfg.vocab_size]
        new = new.argmax(-1, keepdim=True)
        out = torch.cat([out, new], dim=1)
    return out


@pytest.mark.parametrize("family,strategy", [("gpt2", "full")] + [("recurrent_gpt", s) for s in STRATEGIES])
def test_static_cache_generation_equals_dynamic_and_is_allocated_once(family, strategy, monkeypatch):
    """generate() decodes with a static cache sized to the fed tokens (prompt + new - 1), allocated
    by the prefill and never again, and produces the dynamic cache's tokens."""
    from rgpt_dist.flops import kv_cache_bytes
    from rgpt_dist.models.kv_cache import StaticLayerCache

    model, cfg = make(family)
    r = None if family == "gpt2" else R
    prompt = tokens(cfg, 5)
    expected = greedy_dynamic(model, prompt, NEW, strategy, r)
    made, after = captured(model, monkeypatch)
    out = generate(model, prompt, NEW, r=r, strategy=strategy)
    assert torch.equal(out, expected)
    assert_varied(out, 5)
    (cache,) = made
    assert cache.max_len == cache.length == 5 + NEW - 1
    assert all(isinstance(s, StaticLayerCache) for s in cache.stores())
    assert len(after) == NEW and all(a == after[0] for a in after) and after[0]  # same buffers every step
    assert cache.nbytes() == kv_cache_bytes(cfg, 2, 5 + NEW - 1, strategy, r, 4)


def test_eos_stop_returns_a_contiguous_prefix():
    model, cfg = make()
    prompt = tokens(cfg, 5)
    eos = int(generate(model, prompt[:1], NEW)[0, 7])
    out = generate(model, prompt[:1], NEW, eos_token_id=eos)
    assert out.shape[1] < 5 + NEW and out.is_contiguous() and out[0, -1] == eos


@torch.no_grad()
def fixed_shape_logits(model, idx, strategy, r, backend):
    """Teacher-forced decoding of idx (B, T) through generate()'s compiled step: prefill idx[:, :3]
    eagerly, then one token per step on a fixed-shape cache -> logits (B, T - 2, V) of each step."""
    from rgpt_dist.models.generate import compiled_step

    depth = {} if r is None else {"r": r}
    cache = model.make_cache(strategy, r, max_len=idx.shape[1], fixed=True)
    out = [model(idx[:, :3], cache=cache, **depth).logits[:, -1]]
    cache.slots.index = torch.empty(1, dtype=torch.long)
    for t in range(3, idx.shape[1]):
        cache.slots.index.fill_(t)
        out.append(compiled_step(backend, False)(model, idx[:, t:t + 1], cache, depth))
    return torch.stack(out, dim=1)


def compile_cases():
    from rgpt_dist.models.spec import families, spec_for

    cases = [(name, "full") for name in sorted(families())]
    return cases + [("recurrent_gpt", s) for s in STRATEGIES if s != "full"]


@pytest.mark.parametrize("name,strategy", compile_cases())
def test_compiled_decode_step_equals_the_uncompiled_cache(name, strategy):
    """Every family's compiled fixed-shape decode step (whole buffers under a mask, positions from a
    tensor) gives the logits of the ordinary static cache, token by token, with no graph break."""
    from torch._dynamo.utils import counters
    from tests.models.test_kv_cache import decode, family_model

    model, cfg, spec = family_model(name)
    r = spec.default_depth(cfg) if spec.recurrent else None
    idx = tokens(cfg, 12)
    breaks = sum(counters["graph_break"].values())
    got = fixed_shape_logits(model, idx, strategy, r, "aot_eager")
    want = torch.cat(decode(model, [idx[:, :3]] + list(idx[:, 3:].split(1, dim=1)),
                            model.make_cache(strategy, r), **({} if r is None else {"r": r})), dim=1)[:, 2:]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert want.std() > 0.1 and sum(counters["graph_break"].values()) == breaks
    # the steps' logits differ in what they predict (3-10 distinct greedy tokens of 10 per row measured)
    assert all(len(set(row.tolist())) >= 3 for row in want[..., :cfg.vocab_size].argmax(-1))


def test_compiled_generation_equals_eager_and_its_warm_up_is_bounded():
    """generate(compile_backend=...) samples the eager tokens; it compiles twice on its first call
    (the caches' lengths specialised, then symbolic), never again for the same length, and once more
    for a new cache size, after which sizes are symbolic too."""
    from torch._dynamo.utils import counters

    model, cfg = make()
    prompt = tokens(cfg, 5)
    frames = lambda: counters["frames"]["ok"]  # noqa: E731
    start = frames()
    out = generate(model, prompt, NEW, r=R, strategy="full", compile_backend="aot_eager")
    assert torch.equal(out, generate(model, prompt, NEW, r=R, strategy="full"))
    assert_varied(out, 5)
    assert frames() - start <= 2
    first = frames()
    generate(model, prompt, NEW, r=R, strategy="full", compile_backend="aot_eager")
    assert frames() == first
    for n in (NEW + 8, NEW + 4, NEW + 12):
        longer = generate(model, prompt, n, r=R, strategy="full", compile_backend="aot_eager")
        assert torch.equal(longer[:, :5 + NEW], out)
    assert frames() - first <= 1
    with pytest.raises(ValueError, match="needs a strategy"):
        generate(model, prompt, 2, strategy=None, compile_backend="aot_eager")
    with pytest.raises(ValueError, match="needs max_len"):
        from rgpt_dist.models.kv_cache import KVCache
        KVCache(2, fixed=True)
