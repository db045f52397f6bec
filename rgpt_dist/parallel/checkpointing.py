"""Activation checkpointing applied from outside the model (like torchtitan's apply_ac).

Each unit the model names in `checkpoint_units(mode)` has its forward recomputed in backward with
`torch.utils.checkpoint(use_reentrant=False)`: the only variant that works when the same unit runs
R times per step under ZeRO-2/3 (reentrant checkpointing and deepspeed.checkpointing fail with
"parameter already reduced"). Training noise is keyed (rgpt_dist.noise), so recomputation redraws it
exactly without relying on RNG-state bookkeeping.
"""
from __future__ import annotations

import functools

import torch.nn as nn
from torch.utils.checkpoint import checkpoint


def _checkpointed(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run


def apply_activation_checkpointing(model: nn.Module, mode: str) -> list[nn.Module]:
    """Wrap the model's checkpoint units for `mode` (none | recurrence | blocks); returns them."""
    if mode == "none":
        return []
    units = list(model.checkpoint_units(mode))
    for unit in units:
        if not getattr(unit.forward, "__wrapped__", None):
            unit.forward = _checkpointed(unit.forward)
    return units
