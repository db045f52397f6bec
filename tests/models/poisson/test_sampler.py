"""The heavy-tail Poisson-lognormal depth sampler: r = Poisson(exp(t)) + 1, t ~ N(log(E[r] - 1) - s^2/2, s)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.flops import train_flops
from rgpt_dist.models.poisson.sampler import PoissonLogNormalDepth
from rgpt_dist.models.spec import spec_for

N = 20_000


@pytest.mark.parametrize("mean", [4.0, 10.0])
def test_empirical_mean_and_tail_match_the_formula(mean):
    sampler = PoissonLogNormalDepth(mean, 0.5)
    draws = np.array([sampler(1337, step) for step in range(N)])
    assert draws.min() >= 1
    # E[r] = E[exp(t)] + 1 = exp(mu + s^2 / 2) + 1 = mean; the standard error of the mean of 20k draws
    sem = draws.std() / math.sqrt(N)
    assert abs(draws.mean() - mean) < 4 * sem
    pmf = sampler.pmf()
    assert abs(sum(pmf.values()) - 1) < 1e-9
    assert abs(sum(k * p for k, p in pmf.items()) - mean) < 1e-6  # the quadrature agrees with the closed form
    for q in (2 * mean, 3 * mean):  # the heavy tail: P(r > q) from the pmf vs the draws (binomial error)
        p_tail = sum(p for k, p in pmf.items() if k > q)
        se = math.sqrt(p_tail * (1 - p_tail) / N)
        assert abs((draws > q).mean() - p_tail) < 4 * se + 1e-4
    # heavier than a plain Poisson of the same mean (the lognormal rate adds variance)
    assert draws.var() > mean - 1


def test_pure_function_of_seed_and_step():
    """Every rank computes the same depth without communication; another seed gives other depths."""
    a, b = PoissonLogNormalDepth(6.0), PoissonLogNormalDepth(6.0)
    assert [a(1, s) for s in range(200)] == [b(1, s) for s in range(200)]
    assert [a(1, s) for s in range(200)] != [a(2, s) for s in range(200)]


def test_spec_sampler_and_expected_training_flops():
    cfg = load_config("poisson-small-isoflops").model
    sampler = spec_for(cfg).depth_sampler(cfg)
    assert sampler.mean() == cfg.n_loops == 10
    # truncated backprop: the expectation over the pmf is below 3 x forward at E[r]
    expected = sum(p * train_flops(cfg, 1024, k) for k, p in sampler.pmf().items())
    assert train_flops(cfg, 1024) == pytest.approx(expected)
    full = load_config("poisson-small-isoflops", ["model.k_max=1000"]).model
    assert train_flops(cfg, 1024) < train_flops(full, 1024)


def test_depth_sampler_fixed_always_runs_n_loops_and_the_default_is_unchanged():
    """depth_sampler=fixed: r = n_loops at every step and seed (rgpt_dist.depth.FixedDepth); the
    default stays the Poisson-lognormal draw of the same mean and sigma (old configs unchanged)."""
    default = load_config("poisson-small-isoflops").model
    assert default.depth_sampler == "poisson_lognormal"
    assert spec_for(default).depth_sampler(default) == PoissonLogNormalDepth(10.0, 0.5)
    for r in (1, 3, 8):
        cfg = load_config("poisson-debug", ["model.depth_sampler=fixed", f"model.n_loops={r}"]).validate().model
        sampler = spec_for(cfg).depth_sampler(cfg)
        assert {sampler(seed, step) for seed in (0, 1337) for step in range(50)} == {r}
        assert sampler.pmf() == {r: 1.0} and sampler.mean() == r


def test_fixed_depth_n_loops_1_is_valid_but_the_sampled_one_is_refused():
    """A fixed depth of 1 is the sweep's r = 1 model; the Poisson-lognormal draw needs E[r] > 1."""
    load_config("poisson-debug", ["model.depth_sampler=fixed", "model.n_loops=1"]).validate()
    with pytest.raises(ConfigError, match=r"model.n_loops=1: the mean depth must be > 1"):
        load_config("poisson-debug", ["model.n_loops=1"]).validate()
    with pytest.raises(ConfigError, match=r"model.depth_sampler='uniform' is not one of"):
        load_config("poisson-debug", ["model.depth_sampler=uniform"]).validate()


@pytest.mark.parametrize("r", [1, 2, 4, 8])
def test_fixed_depth_train_flops_full_and_truncated_by_formula(r):
    """Eq. 1 at a fixed r (2 + 2 x r + 2 layout, width 128, S = 256): training = 3 x (forward + head);
    with k_max = ceil(r / 2) the first r - k steps (core blocks + adapter) run without autograd, so
    their backward (2 x their forward) is not paid. k_max >= r is full backprop."""
    d, S, n_rec, V = 128, 256, 2, 50257  # the GPT-2 vocabulary, unpadded (pad_vocab_multiple 1)
    block, adapter = 24 * d * d + 4 * S * d, 4 * d * d
    forward = (2 + n_rec * r + 2) * block + r * adapter + 2 * d * V  # head included
    k = math.ceil(r / 2)
    common = ["model.depth_sampler=fixed", "model.d_model=128", "model.n_head=2", "model.n_pre=2",
              f"model.n_rec={n_rec}", f"model.n_loops={r}", "model.n_coda=2"]
    for k_max, no_grad_steps in ((r, 0), (8, 0), (k, r - k)):
        cfg = load_config("poisson-small-isoflops", [*common, f"model.k_max={k_max}"]).validate().model
        want = 3 * forward - 2 * no_grad_steps * (n_rec * block + adapter)
        assert train_flops(cfg, S) == pytest.approx(want, rel=1e-12), (k_max, no_grad_steps)
