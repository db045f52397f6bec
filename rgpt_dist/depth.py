"""Training-depth samplers: r is a pure function of (seed, step), so every rank draws the same depth
without communication (tensor-parallel collectives and ZeRO-3 gathers inside the forward must match)."""
from __future__ import annotations

import dataclasses
import random

from rgpt_dist.seeding import derive_seed


@dataclasses.dataclass(frozen=True)
class UniformDepth:
    """r ~ Uniform{r_min..r_max} per optimizer step (RecurrentGPT, paper section 3.4)."""

    r_min: int
    r_max: int

    def __post_init__(self):
        if not 1 <= self.r_min <= self.r_max:
            raise ValueError(f"UniformDepth needs 1 <= r_min <= r_max, got r_min={self.r_min}, r_max={self.r_max}")

    def __call__(self, seed: int, step: int) -> int:
        return random.Random(derive_seed(seed, step, "depth")).randint(self.r_min, self.r_max)

    def pmf(self) -> dict[int, float]:
        n = self.r_max - self.r_min + 1
        return {r: 1.0 / n for r in range(self.r_min, self.r_max + 1)}

    def mean(self) -> float:
        return (self.r_min + self.r_max) / 2


@dataclasses.dataclass(frozen=True)
class FixedDepth:
    """Always r (fixed-depth training, or evaluation)."""

    r: int

    def __call__(self, seed: int, step: int) -> int:
        return self.r

    def pmf(self) -> dict[int, float]:
        return {self.r: 1.0}

    def mean(self) -> float:
        return float(self.r)


def make_sampler(kind: str, r_min: int, r_max: int) -> UniformDepth | FixedDepth:
    """The sampler a config names: 'uniform' or 'fixed' (= r_max)."""
    if kind == "uniform":
        return UniformDepth(r_min, r_max)
    if kind == "fixed":
        return FixedDepth(r_max)
    raise ValueError(f"unknown depth sampler {kind!r} (known: uniform, fixed)")
