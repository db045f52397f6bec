"""The heavy-tail Poisson-lognormal depth sampler: r = Poisson(exp(t)) + 1, t ~ N(log(E[r] - 1) - s^2/2, s)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rgpt_dist.config import load_config
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
