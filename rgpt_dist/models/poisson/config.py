"""Heavy-tail Poisson depth's model section (torch-free)."""
from __future__ import annotations

import dataclasses
import math
from typing import Literal

from rgpt_dist.sections import out_of_bounds
from rgpt_dist.models.config import LoopedConfig


@dataclasses.dataclass
class PoissonConfig(LoopedConfig):
    """Huginn-style recurrent depth (Geiping et al. 2025; SPEC section 4): prelude, a shared core
    iterated r times on s = core(adapter([s, e])) from a noise state, coda; r drawn from a heavy-tailed
    Poisson-lognormal per optimizer step (or fixed at n_loops: `depth_sampler`), gradient through the
    last k_max steps only."""

    family: str = "poisson"
    """Model family (fixed for this class)."""
    depth_sampler: Literal["poisson_lognormal", "fixed"] = "poisson_lognormal"
    """Training depth schedule: poisson_lognormal = the heavy-tailed draw below (Huginn); fixed =
    always n_loops (rgpt_dist.depth.FixedDepth; mean_depth and depth_sigma unused), the looped
    scaling law's plain baseline (SPEC section 10). k_max < n_loops is allowed with either: at a
    fixed depth it is truncated backprop through the last k_max of n_loops steps. One of the two."""
    mean_depth: float | None = None
    """E[r] of the training sampler; None = n_loops (R), matching the dense model's FLOPs in expectation."""
    depth_sigma: float = 0.5
    """s: std of the log-rate t ~ N(log(E[r] - 1) - s^2 / 2, s); r = Poisson(exp(t)) + 1."""
    k_max: int | None = 8
    """Truncated backprop, absolute: only the last k = min(r, k_max) steps carry gradient (Huginn:
    8 at its mean depth 32); k_max >= 1. In force when k_frac = 0; null (None) when k_frac > 0."""
    k_frac: float = 0.0
    """Truncated backprop relative to the mean depth: k = max(1, round(k_frac x mean depth)) (rounded
    half up; the mean depth is `mean_depth`, or n_loops with depth_sampler=fixed), so that every
    cell truncates as often as Huginn's k = 8 at mean depth 32 does (k_frac = 0.25). 0 (default):
    the absolute k_max above is in force; 0 <= k_frac <= 1. Exactly one of the two is in force:
    k_frac > 0 needs k_max = null."""
    state_std: float = 0.02
    """Std of the initial state s^(0) ~ N(0, state_std^2) (Huginn's 'like-init'); at evaluation a
    fixed draw per position, so results are reproducible and cached decoding is exact. 0 starts from
    zeros (deterministic: what comparisons across data-parallel layouts use)."""

    @property
    def train_mean_depth(self) -> float:
        return float(self.n_loops if self.mean_depth is None else self.mean_depth)

    @property
    def grad_depth(self) -> int:
        """k: the most steps that carry gradient (k_max, or k_frac's share of the mean depth)."""
        if self.k_frac == 0:
            return self.k_max
        mean = self.n_loops if self.depth_sampler == "fixed" else self.train_mean_depth
        return max(1, math.floor(self.k_frac * mean + 0.5))

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">", 0, depth_sigma=self.depth_sigma)
        out += out_of_bounds(path, ">=", 0, state_std=self.state_std)
        out += out_of_bounds(path, ">=", 0, k_frac=self.k_frac) + out_of_bounds(path, "<=", 1, k_frac=self.k_frac)
        if self.k_frac == 0 and self.k_max is None:
            out.append(f"{path}.k_max=None with {path}.k_frac=0: one truncation depth must be in force "
                       f"(k_max >= 1, or 0 < k_frac <= 1 with k_max null)")
        elif self.k_frac == 0:
            out += out_of_bounds(path, ">=", 1, k_max=self.k_max)
        elif self.k_max is not None:
            out.append(f"{path}.k_max={self.k_max} with {path}.k_frac={self.k_frac}: exactly one truncation depth "
                       f"may be in force (set {path}.k_max=null to use k_frac, or {path}.k_frac=0 to use k_max)")
        if self.depth_sampler != "fixed" and self.train_mean_depth <= 1:  # (its values: the Literal's check)
            where = f"{path}.mean_depth={self.mean_depth}" if self.mean_depth is not None else f"{path}.n_loops={self.n_loops}"
            out.append(f"{where}: the mean depth must be > 1 (r = Poisson(rate) + 1 with E[rate] = mean - 1)")
        return out
