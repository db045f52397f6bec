"""Model families: config family name -> model class (imported lazily, so configs stay torch-free)."""
from __future__ import annotations

import importlib
from typing import Any

from rgpt_dist.config.model import ModelConfig

FAMILIES: dict[str, str] = {
    "gpt2": "rgpt_dist.models.gpt2:GPT2",
    "recurrent_gpt": "rgpt_dist.models.recurrent_gpt:RecurrentGPT",
}


def model_class(family: str) -> type:
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r} (known: {', '.join(FAMILIES)})")
    module, name = FAMILIES[family].split(":")
    return getattr(importlib.import_module(module), name)


def build_model(cfg: ModelConfig, factory: Any = None, seed: int | None = None):
    """Instantiate the family's model; with `seed`, initialisation is reproducible."""
    import torch

    if seed is not None:
        torch.manual_seed(seed)
    return model_class(cfg.family)(cfg, factory)
