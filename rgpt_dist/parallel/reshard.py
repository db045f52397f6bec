"""Tensor-parallel state dicts: which dimension each parameter is split along, and splitting a full
(tp = 1) state dict into tp shards or merging shards back. Used by the trainer (a tp run starts from
the split tp = 1 model), by checkpoint export (merging a tp checkpoint) and by the tp tests.

Two ways to know the layout: `tp_layout` reads it off a built tensor-parallel model (megatron
layers, needs the process groups); `layout_for` asks the model definition which split each layer
requests, on the meta device, with no process group: what export uses.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from rgpt_dist.models.layers import LayerFactory, Parallel
from rgpt_dist.registry import build_model


def tp_layout(model: nn.Module) -> dict[str, int | None]:
    """Parameter name -> split dimension (None: replicated), read off a tp model's parameters: the
    attributes megatron-core's parallel layers set on the parameters they split (`tensor_model_parallel`,
    `partition_dim`; what DeepSpeed's is_model_parallel_parameter reads too). Column-parallel weights
    and biases and vocabulary-parallel embeddings are split along dim 0, row-parallel weights along
    dim 1; a row-parallel bias (added after the reduction) and every plain layer are replicated."""
    layout = {}
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            dim = param.partition_dim if getattr(param, "tensor_model_parallel", False) else None
            layout[f"{module_name}.{name}" if module_name else name] = dim
    return layout


class _SplitRecorder(LayerFactory):
    """Plain layers tagged with the split the tensor-parallel factory would give them."""

    def linear(self, in_features: int, out_features: int, *, parallel: Parallel, **kwargs) -> nn.Module:
        layer = super().linear(in_features, out_features, parallel=parallel, **kwargs)
        layer.tp_split = parallel
        return layer

    def embedding(self, num: int, dim: int, *, parallel: Parallel, init_std: float) -> nn.Module:
        layer = super().embedding(num, dim, parallel=parallel, init_std=init_std)
        layer.tp_split = parallel  # "column": the vocabulary (rows) is split
        return layer


def layout_for(cfg) -> dict[str, int | None]:
    """Parameter name -> split dimension for a model config, without building megatron layers:
    column-split weights and biases along dim 0, row-split weights along dim 1 (their bias is added
    after the reduction and replicated), vocabulary-split embeddings along dim 0."""

    with torch.device("meta"):
        model = build_model(cfg, factory=_SplitRecorder())
    layout = {}
    for module_name, module in model.named_modules():
        split = getattr(module, "tp_split", "none")
        for name, _ in module.named_parameters(recurse=False):
            dim = {"column": 0, "row": 1 if name == "weight" else None}.get(split)
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
    missing = sorted(set(layout) - set(shards[0]))
    if missing:
        raise KeyError(f"shard lacks {missing[:3]}")
    return {k: shards[0][k].clone() if dim is None else torch.cat([s[k] for s in shards], dim)
            for k, dim in layout.items()}
