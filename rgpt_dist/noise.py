"""Keyed noise for training-time perturbations (RecurrentGPT's eps_x and eps_g).

A draw is a pure function of (seed, step, micro-batch, data-parallel rank, recurrence index,
stream name). Two consequences the distributed code relies on:
- recomputation under activation checkpointing redraws exactly the same noise;
- tensor-parallel ranks of one data-parallel rank (which hold replicated activations) draw the
  same noise, because the tensor-parallel rank is not part of the key.
"""
from __future__ import annotations

import dataclasses

import torch

from rgpt_dist.seeding import derive_seed


@dataclasses.dataclass(frozen=True)
class NoiseKey:
    """Identifies one micro-batch's forward pass; `at(i)` narrows it to recurrence step i."""

    seed: int
    step: int = 0
    micro_batch: int = 0
    dp_rank: int = 0
    recurrence: int = -1

    @classmethod
    def fresh(cls) -> "NoiseKey":
        """A key from torch's global RNG, for forwards in training mode that were given none
        (reproducible under torch.manual_seed; recomputation-safe because it is drawn once per forward)."""
        return cls(seed=int(torch.randint(0, 2**62, (1,)).item()))

    def at(self, recurrence: int) -> "NoiseKey":
        return dataclasses.replace(self, recurrence=recurrence)

    def normal(self, stream: str, shape: torch.Size | tuple[int, ...], std: float,
               device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """N(0, std^2) of `shape`, drawn in fp32 (identical across dtypes) then cast to `dtype`."""
        gen = torch.Generator(device=device)
        gen.manual_seed(derive_seed(self.seed, self.step, self.micro_batch, self.dp_rank, self.recurrence, stream))
        z = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        return (z * std).to(dtype)
