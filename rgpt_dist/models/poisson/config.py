"""Heavy-tail Poisson depth's model section (torch-free)."""
from __future__ import annotations

import dataclasses
from typing import Literal

from rgpt_dist.config.base import out_of_bounds
from rgpt_dist.config.model import LoopedConfig


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
    k_max: int = 8
    """Truncated backprop: only the last k = min(r, k_max) steps carry gradient (Huginn: 8)."""
    state_std: float = 0.02
    """Std of the initial state s^(0) ~ N(0, state_std^2) (Huginn's 'like-init'); at evaluation a
    fixed draw per position, so results are reproducible and cached decoding is exact. 0 starts from
    zeros (deterministic: what comparisons across data-parallel layouts use)."""

    @property
    def train_mean_depth(self) -> float:
        return float(self.n_loops if self.mean_depth is None else self.mean_depth)

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">", 0, depth_sigma=self.depth_sigma)
        out += out_of_bounds(path, ">=", 0, state_std=self.state_std)
        out += out_of_bounds(path, ">=", 1, k_max=self.k_max)
        if self.depth_sampler != "fixed" and self.train_mean_depth <= 1:  # (its values: the Literal's check)
            where = f"{path}.mean_depth={self.mean_depth}" if self.mean_depth is not None else f"{path}.n_loops={self.n_loops}"
            out.append(f"{where}: the mean depth must be > 1 (r = Poisson(rate) + 1 with E[rate] = mean - 1)")
        return out
