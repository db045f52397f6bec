"""RLT's incremental decoding (rgpt_dist/models/rlt/cache.py, issue 25): Proposition B.1 (the
serving split changes nothing) at every split point of an 11-token sequence for RLT-1, RLT-2 (B = 3:
prompts ending mid-chunk, a partial final chunk) and RLT-0, against the whole-sequence forward and the
fp64 per-token reference of test_rlt_model.py; dynamic and fixed-shape (compiled) storage; greedy
generate() against greedy recomputation; the cache's bytes; misuse errors."""
import pytest
import torch

from rgpt_dist.models.generate import _fixed_shape_step, compiled_step, generate
from rgpt_dist.models.kv_cache import LayerCache
from tests.models.rlt.test_rlt_model import TINY, T, Reference, tiny_model, tokens

VARIANTS = {
    "rlt1": dict(feedback_interval=1),
    "rlt2-B3": dict(feedback_interval=3),
    "rlt0": dict(feedback_interval=0),
    "rlt2-B4-window1-two-groups": dict(feedback_interval=4, window=1, mem_groups=2),
    "rlt1-no-decoder": dict(feedback_interval=1, n_dec=0),
    "rlt1-learned-positions": dict(feedback_interval=1, pos_encoding="learned"),  # (not the reference's rope)
}
SPLITS = sorted(v for v in VARIANTS if v != "rlt1-learned-positions")
TOL = 1e-12  # fp64; measured <= 2.7e-15


@torch.no_grad()
def serve(model, x, sizes, cache=None):
    """Feeds x (B, T) to a fresh cache in pieces of `sizes` tokens -> logits (B, T, V)."""
    cache = model.make_cache() if cache is None else cache
    out = [model(piece, cache=cache).logits for piece in torch.split(x, list(sizes), dim=1)]
    assert cache.length == x.shape[1]
    return torch.cat(out, 1)


@pytest.mark.parametrize("variant", SPLITS)
def test_every_serving_split_equals_the_whole_sequence(variant):
    """Prefill of the first P tokens, then one token at a time, for every P in 1..T (RLT-2 B = 3:
    prompts ending at, before and after chunk boundaries; T = 11 ends on a partial chunk of 2):
    logits equal the whole-sequence forward at every position (<= 1e-12; measured <= 2.7e-15, bitwise when P = T), and
    a prompt in uneven pieces (4, 1, 3, 1, 2: pieces crossing chunk boundaries) too. The whole
    sequence equals the per-token fp64 reference (the register, rings and memory are the paper's)."""
    cfg, model = tiny_model(**VARIANTS[variant])
    x = tokens()[:, :-1]                                                   # (2, T)
    with torch.no_grad():
        whole = model(x).logits
    want = torch.stack([Reference(cfg, model).logits(row.tolist()) for row in x])
    assert (whole - want).abs().max().item() <= TOL
    errs = []
    for P in range(1, T + 1):
        got = serve(model, x, [P] + [1] * (T - P))
        errs.append((got - whole).abs().max().item())
    errs.append((serve(model, x, (4, 1, 3, 1, 2)) - whole).abs().max().item())
    assert max(errs) <= TOL, errs
    assert whole.std() > 0.3  # logits that vary (the comparison is not of constants)


@pytest.mark.parametrize("variant", ["rlt2-B3", "rlt0", "rlt1-learned-positions"])
def test_dynamic_storage_and_the_fixed_shape_step_equal_the_static_cache(variant):
    """make_cache(store=LayerCache) (the Hugging Face export's kind of storage) and the fixed-shape
    step generate() compiles (run eagerly here: whole buffers under masks, positions from the slot
    index; learned position embeddings read it too) give the whole sequence's logits after a
    4-token prefill (mid-chunk for B = 3)."""
    cfg, model = tiny_model(**VARIANTS[variant])
    x = tokens()[:, :-1]
    with torch.no_grad():
        whole = model(x).logits
        assert (serve(model, x, [4] + [1] * (T - 4), model.make_cache(store=LayerCache)) - whole).abs().max() <= TOL
        cache = model.make_cache(max_len=T, fixed=True)
        steps = [model(x[:, :4], cache=cache).logits]
        cache.slots.index = torch.empty(1, dtype=torch.long)
        for t in range(4, T):
            cache.slots.index.fill_(t)
            steps.append(_fixed_shape_step(model, x[:, t:t + 1], cache, {})[:, None])
    assert (torch.cat(steps, 1) - whole).abs().max().item() <= TOL


def test_compiled_decode_step_has_no_graph_break_and_equals_eager():
    """RLT-2 (B = 3) through generate()'s compiled step (aot_eager): the register update is a
    tensor select, so the step compiles without a graph break; its logits equal the eager ones."""
    from torch._dynamo.utils import counters

    cfg, model = tiny_model(feedback_interval=3)
    x = tokens()[:, :-1]
    with torch.no_grad():
        whole = model(x).logits
        cache = model.make_cache(max_len=T, fixed=True)
        steps = [model(x[:, :2], cache=cache).logits]
        cache.slots.index = torch.empty(1, dtype=torch.long)
        breaks = sum(counters["graph_break"].values())
        for t in range(2, T):
            cache.slots.index.fill_(t)
            steps.append(compiled_step("aot_eager", False)(model, x[:, t:t + 1], cache, {})[:, None])
    assert sum(counters["graph_break"].values()) == breaks
    assert (torch.cat(steps, 1) - whole).abs().max().item() <= TOL


@pytest.mark.parametrize("variant", ["rlt1", "rlt2-B3", "rlt0"])
def test_greedy_generate_equals_greedy_recomputation(variant):
    """generate() with the cache samples the tokens of recomputing the whole prefix each step, and
    they vary (not a constant stream)."""
    cfg, model = tiny_model(**VARIANTS[variant])
    prompt = tokens()[:, :5]
    cached = generate(model, prompt, 11)                                   # 5 + 10 fed = 15 <= block_size 16
    assert torch.equal(cached, generate(model, prompt, 11, strategy=None))
    assert cached.shape == (2, 16) and len(set(cached[:, 5:].flatten().tolist())) >= 4


def test_cache_bytes_are_the_stores_the_rings_and_the_state():
    """nbytes: (n_enc + G) static stores of max_len K/V, n_dec rings of W - 1 K/V, the (B, d) state."""
    cfg, model = tiny_model(feedback_interval=3, mem_groups=2)
    cache = model.make_cache(max_len=9)
    assert cache.nbytes() == 0
    with torch.no_grad():
        model(tokens()[:, :5], cache=cache)
    B, d, f64 = 2, cfg.d_model, 8
    stores = (cfg.n_enc + 2) * 2 * B * 9 * d * f64
    rings = cfg.n_dec * 2 * B * (cfg.window - 1) * d * f64
    assert cache.nbytes() == stores + rings + B * d * f64


def test_misuse_is_refused():
    cfg, model = tiny_model(feedback_interval=3)
    x = tokens()[:, :6]
    with pytest.raises(ValueError, match="padded batches"):
        model(x, mask=torch.ones(2, 1, 6, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="no recurrence depth"):
        model.make_cache(r=2)
    cache = model.make_cache(max_len=8, fixed=True)
    cache.slots.index = torch.tensor([0])
    with torch.no_grad(), pytest.raises(ValueError, match="feeds one token, got 2"):
        model(x[:, :2], cache=cache)
    cache = model.make_cache()
    cache.length = 3
    with torch.no_grad(), pytest.raises(ValueError, match="holds 3 tokens but no RLT carry"):
        model(x[:, :1], cache=cache)
    model.train()
    with pytest.raises(ValueError, match="model.eval"):
        model(x, cache=model.make_cache())
    with pytest.raises(ValueError, match=f"exceed block_size={TINY['block_size']}"):
        generate(model, x, TINY["block_size"])
