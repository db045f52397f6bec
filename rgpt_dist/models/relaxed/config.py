"""Relaxed Recursive Transformer's model section (torch-free)."""
from __future__ import annotations

import dataclasses

from rgpt_dist.sections import out_of_bounds
from rgpt_dist.models.config import LoopedConfig


@dataclasses.dataclass
class RelaxedConfig(LoopedConfig):
    """Relaxed Recursive Transformer (Bae et al. 2025; SPEC section 4): prelude, a strictly shared core
    applied R times with one LoRA adapter per recurrence step on the attention and MLP projections,
    coda. Depth-fixed: trained at R, evaluated at depths 0..R (there are adapters for R steps)."""

    family: str = "relaxed"
    """Model family (fixed for this class)."""
    lora_rank: int = 64
    """Rank of every per-step LoRA adapter (the RecurrentGPT paper does not state it; 64 is ours)."""
    lora_alpha: float = 64.0
    """LoRA scale numerator: the update is (lora_alpha / lora_rank) * B A x."""

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">", 0, lora_rank=self.lora_rank, lora_alpha=self.lora_alpha)
        if self.lora_rank > self.d_model:
            out.append(f"{path}.lora_rank={self.lora_rank} exceeds {path}.d_model={self.d_model}")
        if self.mlp != "gelu" or self.d_ff not in (0, 4 * self.d_model):
            out.append(f"{path}.mlp={self.mlp!r}, {path}.d_ff={self.d_ff}: RRT's LoRA adapters are built for "
                       "GPT-2's GELU MLP of width 4 d_model (mlp='gelu', d_ff=0)")
        return out
