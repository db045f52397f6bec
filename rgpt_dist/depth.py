"""Training-depth samplers: r is a pure function of (seed, step), or of (seed, step, micro-batch index)
for a sampler with per_micro_batch, so every rank draws the same depth for its k-th micro-batch
without communication (tensor-parallel collectives and ZeRO-3 gathers inside the forward must match)."""
from __future__ import annotations

import dataclasses
import random

from rgpt_dist.seeding import derive_seed


@dataclasses.dataclass(frozen=True)
class UniformDepth:
    """r ~ Uniform{r_min..r_max} per optimizer step (RecurrentGPT, paper section 3.4), or per
    micro-batch with per_micro_batch (the paper's Listing A draws r inside forward)."""

    r_min: int
    r_max: int
    per_micro_batch: bool = False

    def __post_init__(self):
        if not 1 <= self.r_min <= self.r_max:
            raise ValueError(f"UniformDepth needs 1 <= r_min <= r_max, got r_min={self.r_min}, r_max={self.r_max}")

    def __call__(self, seed: int, step: int, micro: int | None = None) -> int:
        """The depth of optimizer step `step` (micro None), or of its micro-batch `micro`."""
        key = derive_seed(seed, step, "depth") if micro is None else derive_seed(seed, step, micro, "depth")
        return random.Random(key).randint(self.r_min, self.r_max)

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


def step_depths(sampler, seed: int, step: int, micro_batches: int) -> list[int | None]:
    """The depth of each micro-batch of optimizer step `step`: one draw for all of them, or one per
    micro-batch where the sampler has per_micro_batch; None for models without a depth."""
    if sampler is None:
        return [None] * micro_batches
    if getattr(sampler, "per_micro_batch", False):
        return [sampler(seed, step, m) for m in range(micro_batches)]
    return [sampler(seed, step)] * micro_batches


def make_sampler(kind: str, r_min: int, r_max: int, per_micro_batch: bool = False) -> UniformDepth | FixedDepth:
    """The sampler a config names: 'uniform' (per step, or per micro-batch) or 'fixed' (= r_max)."""
    if kind == "uniform":
        return UniformDepth(r_min, r_max, per_micro_batch)
    if kind == "fixed":
        return FixedDepth(r_max)
    raise ValueError(f"unknown depth sampler {kind!r} (known: uniform, fixed)")
