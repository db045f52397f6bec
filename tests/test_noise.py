"""Keyed noise (rgpt_dist.noise): a pure function of the key, N(0, std^2) by moments, a
Kolmogorov-Smirnov test and a 2-D uniformity test, independent across neighbouring elements,
streams, recurrence steps and key fields, and traceable: a compiled forward given a new key every
call breaks no graph and compiles once (backends aot_eager and, slow, inductor)."""
import math

import pytest
import torch
from torch._dynamo.utils import counters

from rgpt_dist import noise
from rgpt_dist.noise import NoiseKey, keyed_normal
from rgpt_dist.seeding import derive_seed

SHAPE, CPU = (64, 256), torch.device("cpu")
N = 1_000_000


def draw(key: NoiseKey, stream: str = "x", shape=(1000, 1000), std: float = 1.0, dtype=torch.float32):
    return key.normal(stream, shape, std, CPU, dtype)


def corr(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack((a.flatten().double(), b.flatten().double())))[0, 1].item()


def ks_statistic(z: torch.Tensor) -> float:
    """sup |F_n - Phi| of the sample z."""
    f = torch.special.ndtr(z.flatten().double().sort().values)
    n = f.numel()
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return max((i / n - f).max().item(), (f - (i - 1) / n).max().item())


KS_CRITICAL_001 = 1.9495  # sqrt(n) * D at significance 0.001 (Kolmogorov distribution)
CORR_BOUND = 5 / math.sqrt(N)  # five standard errors of a correlation of independent samples


def test_same_key_same_draw_and_every_key_part_matters():
    key = NoiseKey(seed=1, step=2, micro_batch=3, dp_rank=4).at(5)
    a = key.normal("x", SHAPE, 1.0, CPU, torch.float32)
    assert torch.equal(a, key.normal("x", SHAPE, 1.0, CPU, torch.float32))
    assert torch.equal(a, NoiseKey(1, 2, 3, 4, 5).normal("x", SHAPE, 1.0, CPU, torch.float32))  # at(5) == built at 5
    variants = [NoiseKey(9, 2, 3, 4, 5), NoiseKey(1, 9, 3, 4, 5), NoiseKey(1, 2, 9, 4, 5), NoiseKey(1, 2, 3, 9, 5),
                NoiseKey(1, 2, 3, 4, 9)]
    for other in variants:
        assert not torch.equal(a, other.normal("x", SHAPE, 1.0, CPU, torch.float32))
    assert not torch.equal(a, key.normal("g", SHAPE, 1.0, CPU, torch.float32))


def test_draws_are_gaussian_with_the_requested_std_and_dtype_independent():
    z = NoiseKey(seed=0).normal("x", (1000, 100), 0.1, CPU, torch.float32)
    assert abs(z.mean().item()) < 0.002 and abs(z.std().item() - 0.1) < 0.002
    z16 = NoiseKey(seed=0).normal("x", (1000, 100), 0.1, CPU, torch.bfloat16)
    assert z16.dtype == torch.bfloat16 and torch.equal(z16, z.to(torch.bfloat16))
    z64 = NoiseKey(seed=0).normal("x", (1000, 100), 0.1, CPU, torch.float64)
    assert torch.equal(z64, z.double())  # drawn in fp32, then cast


def test_fresh_keys_follow_the_global_rng():
    torch.manual_seed(0)
    a = NoiseKey.fresh()
    torch.manual_seed(0)
    assert NoiseKey.fresh() == a and NoiseKey.fresh() != a


def test_derive_seed_is_stable():
    assert derive_seed(1337, 0, "depth") == derive_seed(1337, 0, "depth")
    assert derive_seed(1, 2) != derive_seed(2, 1) and derive_seed("a") != derive_seed("b")
    assert 0 <= derive_seed(-5, 2**40) < 2**63


def test_draw_is_pinned():
    """A regression pin of the draw itself (base words, draw key, element hash, Box-Muller): a change
    of these numbers changes every run's noise, so it must be deliberate. The integers are exact on
    every platform; the normals pass through fp32 log, sqrt, cos and sin (a few ulp apart across
    CPU instruction sets)."""
    key = NoiseKey(seed=1337, step=11, micro_batch=2, dp_rank=1).at(3)
    assert key._words.tolist() == [773478175, 409339716]
    k0, k1 = noise.draw_key(tuple(key._words.tolist()), 3, "x")
    assert (k0, k1) == (2589860981, 1383129183)
    h = noise._mix32_(noise._mix32_(torch.arange(6).bitwise_xor_(k0)).bitwise_xor_(k1))
    assert h.tolist() == [121636302, 598658615, 3273753908, 2993165072, 4197061070, 1325015232]
    # Box-Muller in float64 from the pinned integers (the counter's rounding to fp32 is part of the
    # algorithm, IEEE round-to-nearest: the same everywhere), pinned to the values first drawn
    pairs = h.view(3, 2)
    u1 = (pairs[:, 0] + 1).to(torch.float32).double() * 2.0**-32
    u2 = (pairs[:, 1] >> 8).double() * 2.0**-24
    radius, theta = torch.sqrt(-2 * torch.log(u1)), 2 * math.pi * u2
    z64 = torch.stack((radius * torch.cos(theta), radius * torch.sin(theta)), dim=1).flatten()
    expected = [1.709776520729065, 2.050607442855835, -0.24131686985492706, -0.6962610483169556,
                -0.07717562466859818, 0.20040635764598846]
    torch.testing.assert_close(z64, torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0)
    # the fp32 draw within what fp32 log, cos and sin (4 ulp each, as vectorised libms promise at most),
    # the correctly rounded sqrt and products, theta's rounding (half an ulp of a value below 8) and the
    # fp32 constant 2 pi can add: |z| (8 ulp) + |radius| (2 pi 2^-22); any change of the draw moves
    # a value by O(1)
    got = key.normal("x", (6,), 1.0, CPU, torch.float32).double()
    bound = radius.repeat_interleave(2) * (8 * 2.0**-23 + 2 * math.pi * 2.0**-22)
    assert ((got - z64).abs() <= bound).all(), ((got - z64).abs().tolist(), bound.tolist())


def test_moments_ks_and_tails_match_a_standard_normal():
    z = draw(NoiseKey(seed=0, step=0).at(0)).double().flatten()
    mean = z.mean().item()
    c = z - mean
    var = (c**2).mean().item()
    skew = ((c**3).mean() / var**1.5).item()
    kurt = ((c**4).mean() / var**2).item() - 3
    # standard errors at n = 1e6: mean 0.001, var 0.0014, skew 0.0024, excess kurtosis 0.0049
    assert abs(mean) < 0.005 and abs(var - 1) < 0.007 and abs(skew) < 0.012 and abs(kurt) < 0.025
    assert math.sqrt(N) * ks_statistic(z) < KS_CRITICAL_001
    tail = (z.abs() > 3).double().mean().item()                  # 2.70e-3 for N(0, 1); standard error 5e-5
    assert abs(tail - 0.0026998) < 3e-4
    assert z.abs().max().item() < math.sqrt(64 * math.log(2))   # u1 >= 2^-32: |z| <= 6.66
    for key, stream in [(NoiseKey(seed=5, step=9, micro_batch=1, dp_rank=3).at(7), "g"),
                        (NoiseKey(seed=2**40, step=123456), "state")]:
        assert math.sqrt(N) * ks_statistic(draw(key, stream)) < KS_CRITICAL_001


def test_neighbouring_elements_are_independent():
    """Elements 2j and 2j + 1 share a Box-Muller pair (cos and sin of one angle): uncorrelated, and
    so are their squares (dependent radii would correlate those); 2j + 1 and 2j + 2 come from
    different pairs. Consecutive elements also fill a 16 x 16 grid of Phi(z) uniformly."""
    z = draw(NoiseKey(seed=4, step=1).at(2)).double().flatten()
    even, odd = z[0::2], z[1::2]
    assert abs(corr(even, odd)) < CORR_BOUND * math.sqrt(2)
    assert abs(corr(even**2, odd**2)) < CORR_BOUND * math.sqrt(2)
    assert abs(corr(odd[:-1], even[1:])) < CORR_BOUND * math.sqrt(2)
    assert abs(corr(z[:-1], z[1:])) < CORR_BOUND and abs(corr(z[:-2], z[2:])) < CORR_BOUND
    for lag in (1024, 1000, 4096):  # a row apart in (B, T, d) layouts
        assert abs(corr(z[:-lag], z[lag:])) < CORR_BOUND
    for offset in (0, 1):  # pair mates, then neighbours across pairs
        u = torch.special.ndtr(z[offset:offset + N - 2]).view(-1, 2)
        cells = (u * 16).long().clamp_(max=15)
        counts = torch.bincount(cells[:, 0] * 16 + cells[:, 1], minlength=256).double()
        expected = u.shape[0] / 256
        chi2 = ((counts - expected) ** 2 / expected).sum().item()
        assert chi2 < 330.5  # chi-square, 255 degrees of freedom, significance 0.001


def test_streams_steps_and_key_fields_draw_independent_noise():
    """Draws whose keys differ in one part (stream, recurrence step, seed, optimizer step,
    micro-batch, data-parallel rank) are uncorrelated, as are their squares, also shifted by one
    element (a key change that only offset the counter would show there)."""
    shape, bound = (500, 1000), 5 / math.sqrt(500_000)
    base = NoiseKey(seed=1, step=2, micro_batch=3, dp_rank=4)
    z = draw(base.at(0), shape=shape)
    others = {"stream g": draw(base.at(0), "g", shape), "stream state": draw(base.at(0), "state", shape),
              "step 1": draw(base.at(1), shape=shape), "no step": draw(base, shape=shape),
              "seed": draw(NoiseKey(2, 2, 3, 4).at(0), shape=shape),
              "optimizer step": draw(NoiseKey(1, 3, 3, 4).at(0), shape=shape),
              "micro-batch": draw(NoiseKey(1, 2, 4, 4).at(0), shape=shape),
              "dp rank": draw(NoiseKey(1, 2, 3, 5).at(0), shape=shape)}
    for name, other in others.items():
        assert abs(corr(z, other)) < bound, name
        assert abs(corr(z**2, other**2)) < bound, name
        assert abs(corr(z.flatten()[1:], other.flatten()[:-1])) < bound, name
        assert abs(corr(z.flatten()[:-1], other.flatten()[1:])) < bound, name


def test_shapes_odd_sizes_and_prefixes():
    key = NoiseKey(seed=8).at(1)
    big = draw(key, shape=(1001,))
    for shape in [(), (1,), (3,), (2, 3, 5), (0,), (4, 0, 2)]:
        z = draw(key, shape=shape)
        assert z.shape == torch.Size(shape) and z.dtype == torch.float32
        assert torch.equal(z.flatten(), big[:z.numel()])  # element e depends on the key and e alone
    assert torch.isfinite(big).all()


def test_the_hash_never_overflows_and_keyed_normal_is_the_same_draw():
    """Every intermediate of the element hash stays within int64 for every 32-bit word: the products
    are below 2^63 in magnitude (checked on the extremes in exact Python integers), and the tensor
    and Python-int versions of the hash agree."""
    for x in (0, 1, 2**31 - 1, 2**31, 2**32 - 1):
        for mult in (noise._MUL1, noise._MUL2):
            assert abs(x * mult) < 2**63
    words = torch.tensor([0, 1, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1, 0x12345678], dtype=torch.int64)
    assert [noise._mix32(w) for w in words.tolist()] == noise._mix32(words).tolist()
    assert noise._mix32(words.clone()).tolist() == noise._mix32_(words.clone()).tolist()
    assert all(0 <= v < 2**32 for v in noise._mix32(words).tolist())
    key = NoiseKey(seed=6, step=1).at(4)
    k0, k1 = noise.draw_key(tuple(key._words.tolist()), 4, "g")
    z = keyed_normal(torch.tensor([k0, k1]), (5, 7))
    assert torch.equal(z, key.normal("g", (5, 7), 1.0, CPU, torch.float32))
    with pytest.raises(ValueError, match="at most"):
        noise._normals(0, 0, 2**32, CPU)


def test_stream_names_map_to_distinct_ids():
    names = ["x", "g", "state", "", "X", "xx", "x ", "eps_x", "eps_g"]
    assert len({noise.stream_id(n) for n in names}) == len(names)


# ---- torch.compile -----------------------------------------------------------------------------

@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _draws(key: NoiseKey, shape: tuple[int, ...]) -> list[torch.Tensor]:
    """What a recurrent forward draws: per step i, the "x" and "g" streams of key.at(i)."""
    out = []
    for i in range(3):
        k = key.at(i)
        out.append(k.normal("x", shape, 0.3, CPU, torch.float32))
        out.append(k.normal("g", shape, 1.0, CPU, torch.bfloat16))
    return out


KEYS = [NoiseKey(seed=3, step=0), NoiseKey(seed=3, step=1), NoiseKey(seed=3, step=1, micro_batch=1),
        NoiseKey(seed=3, step=2, dp_rank=1), NoiseKey(seed=4, step=7)]


def _one_draw(key: NoiseKey, shape: tuple[int, ...]) -> list[torch.Tensor]:
    return [key.at(1).normal("x", shape, 1.0, CPU, torch.float32)]


def _check_compiled_draws(fn, backend: str, keys: list[NoiseKey], bitwise: bool):
    compiled = torch.compile(fn, backend=backend, fullgraph=True)  # fullgraph: a graph break would raise
    with torch._dynamo.config.patch(error_on_recompile=True):    # and so would a recompilation
        for key in keys:
            for got, want in zip(compiled(key, (5, 33)), fn(key, (5, 33))):
                if bitwise:
                    assert torch.equal(got, want)
                else:  # measured: ~5% of elements differ, by at most 3 ulp
                    torch.testing.assert_close(got, want, atol=1e-7, rtol=4 * 2**-23)
    assert counters["stats"]["unique_graphs"] == 1 and sum(counters["graph_break"].values()) == 0


def test_compiled_draws_with_a_new_key_every_call_never_recompile(fresh_dynamo):
    _check_compiled_draws(_draws, "aot_eager", KEYS, bitwise=True)


@pytest.mark.slow
def test_inductor_draws_with_a_new_key_every_call_never_recompile(fresh_dynamo):
    """Inductor's fused CPU kernel (C++; about 100 s to compile on 2 busy cores): one draw."""
    _check_compiled_draws(_one_draw, "inductor", KEYS[:3], bitwise=False)


def test_compiled_recurrent_forward_with_a_new_key_every_call(fresh_dynamo):
    """The whole RecurrentGPT forward compiled, its loop over recurrence steps unrolled (key.at(i)
    and two draws per step inside), activation checkpointing on, a new NoiseKey every call (step,
    micro-batch, data-parallel rank): one compilation, no graph break, eager's loss bitwise."""
    from rgpt_dist.config import RecurrentGPTConfig
    from rgpt_dist.models.recurrent_gpt.model import RecurrentGPT
    from rgpt_dist.parallel.checkpointing import apply_activation_checkpointing

    torch.manual_seed(0)
    cfg = RecurrentGPTConfig(vocab_size=128, block_size=32, d_model=32, n_head=2, n_pre=1, n_rec=1, n_coda=1,
                             n_loops=3, sigma_x=0.3, sigma_g=0.5)
    model = RecurrentGPT(cfg).train()
    apply_activation_checkpointing(model, "recurrence")
    compiled = torch.compile(model, backend="aot_eager")
    idx = torch.randint(0, cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    losses = set()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for key in KEYS[:4]:
            got = compiled(idx[:, :-1], idx[:, 1:], r=3, noise_key=key)
            got.loss.backward()
            want = model(idx[:, :-1], idx[:, 1:], r=3, noise_key=key)
            assert torch.equal(got.loss, want.loss)
            losses.add(got.loss.item())
    assert len(losses) == 4  # every key drew its own noise
    assert counters["frames"]["ok"] == 1 and counters["stats"]["unique_graphs"] == 1
    assert sum(counters["graph_break"].values()) == 0


def test_keys_built_under_another_default_device_keep_their_words_on_the_cpu():
    with torch.device("meta"):
        key = NoiseKey(seed=1, step=2)
    assert key._words.device == CPU
    assert torch.equal(key.normal("x", SHAPE, 1.0, CPU, torch.float32),
                       NoiseKey(seed=1, step=2).normal("x", SHAPE, 1.0, CPU, torch.float32))
