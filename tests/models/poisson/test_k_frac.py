"""Heavy-tail Poisson's truncation depth relative to the mean depth (issue #29): k_frac > 0 gives
k = max(1, round(k_frac x mean depth)) in place of the absolute k_max. The truncation probability
P(r > k) the sampler computes against an integral written here over t ~ N(mu, s) of the Poisson
tail and against a Monte-Carlo of the sampler's own draws; the k in force against the formula, in
the config, the spec's FLOPs and the steps a training forward runs with autograd."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.flops import train_flops
from rgpt_dist.models.poisson.config import PoissonConfig
from rgpt_dist.models.poisson.model import PoissonDepthGPT
from rgpt_dist.models.poisson.sampler import PoissonLogNormalDepth
from rgpt_dist.models.spec import spec_for
from rgpt_dist.noise import NoiseKey

N = 20_000


def tail_by_integral(mean: float, k: int, sigma: float = 0.5) -> float:
    """P(r > k), r = Poisson(exp(t)) + 1, t ~ N(log(mean - 1) - s^2 / 2, s): 1 - the integral over t
    (trapezoid, +-12 s, 24001 points) of the density times P(Poisson(exp(t)) <= k - 1)."""
    mu = math.log(mean - 1) - sigma ** 2 / 2
    t = np.linspace(mu - 12 * sigma, mu + 12 * sigma, 24001)
    rate = np.exp(t)
    cdf = sum(np.exp(j * t - rate - math.lgamma(j + 1)) for j in range(k))
    density = np.exp(-((t - mu) / sigma) ** 2 / 2) / (sigma * math.sqrt(2 * math.pi))
    return 1.0 - float(np.trapezoid(density * cdf, t))


def k_formula(k_frac: float, mean: float) -> int:
    return max(1, math.floor(k_frac * mean + 0.5))


@pytest.mark.parametrize("mean,k,issue", [(10.0, 8, 0.53), (4.0, 8, 0.05), (6.0, 8, 0.19), (10.0, 3, None),
                                          (33.0, 8, None)])
def test_truncation_probability_matches_integral_and_monte_carlo(mean, k, issue):
    """The small / medium / large cells' mean depths 10 / 4 / 6 truncate at k_max = 8 with the
    issue's 0.53 / 0.05 / 0.19; Huginn's rate mean 32 (E[r] = 33 here) truncates at k = 8 almost always."""
    sampler = PoissonLogNormalDepth(mean, 0.5)
    analytic = sampler.truncation_probability(k)
    assert abs(analytic - tail_by_integral(mean, k)) < 1e-12  # measured <= 2.2e-16
    draws = np.array([sampler(1337, step) for step in range(N)])
    se = math.sqrt(analytic * (1 - analytic) / N)
    assert abs((draws > k).mean() - analytic) < 4 * se
    if issue is not None:
        assert round(analytic, 2) == issue
    if mean == 33.0:
        assert analytic > 0.98


@pytest.mark.parametrize("k_frac,over", [(0.25, ["model.n_loops=10"]), (0.25, ["model.n_loops=6"]),
                                         (0.25, ["model.n_loops=4"]), (0.5, ["model.mean_depth=7.0"]),
                                         (0.1, ["model.n_loops=4"]),
                                         (0.3, ["model.depth_sampler=fixed", "model.n_loops=5", "model.mean_depth=20.0"])])
def test_k_frac_sets_the_truncation_depth_from_the_mean_depth(k_frac, over):
    cfg = load_config("poisson-debug", [*over, "model.k_max=null", f"model.k_frac={k_frac}"]).validate().model
    mean = cfg.n_loops if cfg.depth_sampler == "fixed" or cfg.mean_depth is None else cfg.mean_depth
    k = k_formula(k_frac, mean)
    assert cfg.grad_depth == k
    spec = spec_for(cfg)
    assert [spec.grad_steps(cfg, r) for r in range(1, 13)] == [min(r, k) for r in range(1, 13)]
    absolute = load_config("poisson-debug", [*over, f"model.k_max={k}"]).validate().model
    assert train_flops(cfg, 64) == train_flops(absolute, 64)


def test_a_training_forward_runs_the_last_k_steps_with_autograd():
    """k_frac = 0.4 of n_loops = 5: k = 2; at r = 1..6 the last min(r, 2) steps record a graph."""
    torch.manual_seed(0)
    cfg = PoissonConfig(vocab_size=64, block_size=16, d_model=16, n_head=2, n_pre=1, n_rec=1, n_coda=1, n_loops=5,
                        k_max=None, k_frac=0.4)
    model = PoissonDepthGPT(cfg).train()
    grad_on: list[bool] = []
    model.recurrence.register_forward_pre_hook(lambda m, a: grad_on.append(torch.is_grad_enabled()))
    idx = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    for r in range(1, 7):
        grad_on.clear()
        model(idx, idx, r=r, noise_key=NoiseKey(1))
        k = min(r, 2)
        assert grad_on == [False] * (r - k) + [True] * k, r


def test_defaults_keep_k_max_and_both_in_force_is_refused():
    for name in ("poisson-small-isoflops", "poisson-medium-isoflops", "poisson-large-isoflops"):
        cfg = load_config(name).model
        assert (cfg.k_max, cfg.k_frac, cfg.grad_depth) == (8, 0.0, 8)
    with pytest.raises(ConfigError, match=r"model.k_max=8 with model.k_frac=0.25: exactly one truncation depth "
                                          r"may be in force \(set model.k_max=null to use k_frac"):
        load_config("poisson-debug", ["model.k_max=8", "model.k_frac=0.25"])
    with pytest.raises(ConfigError, match=r"model.k_max=None with model.k_frac=0: one truncation depth must be in force"):
        load_config("poisson-debug", ["model.k_max=null"])
    with pytest.raises(ConfigError, match=r"model.k_frac=1.5 must be <= 1"):
        load_config("poisson-debug", ["model.k_max=null", "model.k_frac=1.5"])
    with pytest.raises(ConfigError, match=r"model.k_frac=-0.1 must be >= 0"):
        load_config("poisson-debug", ["model.k_frac=-0.1"])
