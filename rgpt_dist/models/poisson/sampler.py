"""The heavy-tail Poisson-lognormal depth sampler (Geiping et al. 2025), drawn from (seed, step) so
every rank agrees without communication."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from rgpt_dist.seeding import derive_seed


@dataclasses.dataclass(frozen=True)
class PoissonLogNormalDepth:
    """r = Poisson(exp(t)) + 1 with t ~ N(log(mean - 1) - s^2 / 2, s): E[exp(t)] = mean - 1, E[r] = mean."""

    mean_depth: float
    sigma: float = 0.5

    def __post_init__(self):
        if not (self.mean_depth > 1 and self.sigma > 0):
            raise ValueError(f"PoissonLogNormalDepth needs mean_depth > 1 and sigma > 0, got {self}")

    @property
    def mu(self) -> float:
        return math.log(self.mean_depth - 1) - self.sigma ** 2 / 2

    def __call__(self, seed: int, step: int) -> int:
        rng = np.random.default_rng(derive_seed(seed, step, "depth"))
        t = rng.normal(self.mu, self.sigma)
        return int(rng.poisson(math.exp(t))) + 1

    def mean(self) -> float:
        return float(self.mean_depth)

    def _quadrature(self, nodes: int) -> tuple[np.ndarray, np.ndarray]:
        """Gauss-Hermite nodes over t: (the Poisson rates exp(t), their weights summing to 1)."""
        x, w = np.polynomial.hermite_e.hermegauss(nodes)         # weight exp(-x^2 / 2)
        return np.exp(self.mu + self.sigma * x), w / math.sqrt(2 * math.pi)

    @staticmethod
    def _mass(rate: np.ndarray, w: np.ndarray, k: int) -> float:
        """P(r = k + 1): the Poisson pmf at k averaged over the rates."""
        return float(np.sum(w * np.exp(k * np.log(rate) - rate - math.lgamma(k + 1))))

    def pmf(self, tail: float = 1e-12, nodes: int = 96) -> dict[int, float]:
        """P(r) by Gauss-Hermite quadrature over t of the Poisson pmf, up to where the remaining
        mass is below `tail` (which is dropped; the values sum to 1 - tail or more)."""
        rate, w = self._quadrature(nodes)
        out, total, k = {}, 0.0, 0
        while total < 1 - tail and k < 100_000:
            p = self._mass(rate, w, k)
            out[k + 1] = p
            total += p
            k += 1
        return out

    def truncation_probability(self, k: int, nodes: int = 96) -> float:
        """P(r > k): how often truncated backprop with k gradient steps drops steps, 1 - sum_{j<=k}
        P(r = j) by the same quadrature."""
        rate, w = self._quadrature(nodes)
        return max(0.0, 1.0 - sum(self._mass(rate, w, j) for j in range(max(k, 0))))
