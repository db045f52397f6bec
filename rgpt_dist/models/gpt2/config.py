"""GPT-2's model section (torch-free)."""
from __future__ import annotations

import dataclasses

from rgpt_dist.sections import out_of_bounds
from rgpt_dist.models.config import ModelConfig


@dataclasses.dataclass
class GPT2Config(ModelConfig):
    """Dense GPT-2 (pre-norm, GELU MLP 4d, learned positions, tied head): the baseline. The shared
    block fields (norm, mlp, d_ff, qk_norm, pos_encoding, mup_base_width) also make it the RLT paper's
    Transformer baseline (flavours rlt-transformer-*, docs/models.md)."""

    family: str = "gpt2"
    """Model family (fixed for this class)."""
    n_layer: int = 12
    """Transformer blocks."""

    def problems(self, path: str) -> list[str]:
        return super().problems(path) + out_of_bounds(path, ">", 0, n_layer=self.n_layer)
