"""Activation checkpointing applied from outside the model (like torchtitan's apply_ac).

Each unit the model names in `checkpoint_units(mode)` has its forward recomputed in backward with
`torch.utils.checkpoint(use_reentrant=False)`: the only variant that works when the same unit runs
R times per step under ZeRO-2/3 (reentrant checkpointing and deepspeed.checkpointing fail with
"parameter already reduced"). Training noise is keyed (rgpt_dist.noise), so recomputation redraws it
exactly without relying on RNG-state bookkeeping.

Modes: `recurrence` recomputes each unit whole (least memory: one saved state per recurrence step);
`selective` does the same per unit but keeps the outputs of matmuls and attention, recomputing only
the cheap pointwise work (LayerNorm, GELU, gate arithmetic): much less recompute time, more memory;
`blocks` is `recurrence` plus every prelude/coda block.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

_aten = torch.ops.aten
# Ops whose outputs `selective` keeps instead of recomputing: the matmuls and fused attention.
_SAVE = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default,
         _aten._scaled_dot_product_flash_attention.default,
         _aten._scaled_dot_product_flash_attention_for_cpu.default,
         _aten._scaled_dot_product_efficient_attention.default,
         _aten._scaled_dot_product_cudnn_attention.default}


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(forward, selective: bool):
    extra = {"context_fn": functools.partial(create_selective_checkpoint_contexts, _save_matmuls)} if selective else {}

    @functools.wraps(forward)
    def run(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)
    run.checkpointed = True  # not `__wrapped__`: a compiled forward (parallel.compile) has one too
    return run


def apply_activation_checkpointing(model: nn.Module, mode: str) -> list[nn.Module]:
    """Wrap the model's checkpoint units for `mode` (none | recurrence | selective | blocks)."""
    if mode == "none":
        return []
    units = list(model.checkpoint_units("blocks" if mode == "blocks" else "recurrence"))
    for unit in units:
        if not getattr(unit.forward, "checkpointed", False):
            unit.forward = _checkpointed(unit.forward, selective=mode == "selective")
    return units
