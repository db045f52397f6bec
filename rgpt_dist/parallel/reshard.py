"""Tensor-parallel state dicts: which dimension each parameter is split along, and splitting a full
(tp = 1) state dict into tp shards or merging shards back. Used by checkpoint export and by the tests
that compare tp > 1 with tp = 1."""
from __future__ import annotations

import torch
import torch.nn as nn


def tp_layout(model: nn.Module) -> dict[str, int | None]:
    """Parameter name -> split dimension (None: replicated), read off the layers a tp model holds."""
    from megatron.core.tensor_parallel import VocabParallelEmbedding

    from rgpt_dist.parallel.tensor_parallel import ColumnLinear, RowLinear

    layout = {}
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            dim = None
            if isinstance(module, (ColumnLinear, VocabParallelEmbedding)):
                dim = 0
            elif isinstance(module, RowLinear) and name == "weight":
                dim = 1
            layout[f"{module_name}.{name}" if module_name else name] = dim
    return layout


def split_state_dict(full: dict[str, torch.Tensor], layout: dict[str, int | None], tp_rank: int,
                     tp_size: int) -> dict[str, torch.Tensor]:
    """This rank's shard of every parameter of a full state dict."""
    missing = sorted(set(layout) - set(full))
    if missing:
        raise KeyError(f"state dict lacks {missing[:3]}")
    return {k: (full[k] if dim is None else full[k].chunk(tp_size, dim)[tp_rank]).clone()
            for k, dim in layout.items()}


def merge_state_dicts(shards: list[dict[str, torch.Tensor]], layout: dict[str, int | None]) -> dict[str, torch.Tensor]:
    """The full state dict from every rank's shard (in tp-rank order)."""
    return {k: shards[0][k].clone() if dim is None else torch.cat([s[k] for s in shards], dim)
            for k, dim in layout.items()}
