"""Building models: the family's spec (rgpt_dist.models.spec) chooses the class, imported lazily so
that configs stay torch-free."""
from __future__ import annotations

from typing import Any

from rgpt_dist.models.config import ModelConfig
from rgpt_dist.models.spec import spec_for


def build_model(cfg: ModelConfig, factory: Any = None, seed: int | None = None):
    """Instantiate the family's model; with `seed`, initialisation is reproducible."""
    import torch  # torch only here: the module's other functions run without it

    if seed is not None:
        torch.manual_seed(seed)
    return spec_for(cfg).build(cfg, factory)
