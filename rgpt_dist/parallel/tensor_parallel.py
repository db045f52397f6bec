"""Tensor parallelism through the model's layer factory: megatron-core layers at tp > 1.

The model files stay plain PyTorch; they ask the factory for each linear layer with the split it
needs (attention qkv and MLP fc column-parallel, their output projections row-parallel, the gate's
first layer column- and its second row-parallel, W_proj row-parallel on its replicated input) and for
the token embedding (vocabulary-parallel). Layer norms and position embeddings stay replicated. The tied LM head multiplies by the local
vocabulary shard of the embedding, and the loss is megatron's vocabulary-parallel cross-entropy with
the padding columns masked out.

Under torch.compile (parallel.compile=blocks traces each Block and the head) the linear layers take
a traceable path: F.linear between megatron's own region mappings (copy-to / scatter-to /
reduce-from the tensor-parallel region, whose synchronous all-reduces dynamo turns into functional
collectives), with the group passed explicitly. megatron's fused linear function issues its
input-gradient all-reduce with async_op=True and warns through `warnings.warn`, and dynamo breaks
the graph on both (29 breaks in the debug model, 0 on this path). Eager runs keep megatron's
forward, whose backward overlaps that all-reduce with the weight-gradient product; compiled, the
overlap is the compiler's to schedule. Same products, same reductions: the compiled tp = 2 run
reproduces tp = 1 (tests/train/test_distributed.py).
"""
from __future__ import annotations

import functools

import torch
from torch.distributed import distributed_c10d
import torch.nn as nn
import torch.nn.functional as F

from rgpt_dist.models.layers import LayerFactory, Parallel
from rgpt_dist.parallel.megatron_cpu import apply_cpu_compat

apply_cpu_compat()

from megatron.core import parallel_state, tensor_parallel  # noqa: E402
from megatron.core.model_parallel_config import ModelParallelConfig  # noqa: E402


class ColumnLinear(tensor_parallel.ColumnParallelLinear):
    """Output features sharded; returns a tensor (megatron returns (output, bias)). `weight`: another
    weight of this rank's shard's shape (a merged low-rank update), as megatron allows."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            return super().forward(x, weight=weight)[0]
        # compiled: megatron's traceable mappings around F.linear (the module docstring says why)
        x = tensor_parallel.copy_to_tensor_model_parallel_region(x, group=self.tp_group)
        return F.linear(x, self.weight if weight is None else weight, self.bias)


class RowLinear(tensor_parallel.RowParallelLinear):
    """Input features sharded, output all-reduced (bias added after the reduction). `weight`:
    another weight of this rank's shard's shape; megatron's forward takes none, so that path runs
    the same three steps here (slice a replicated input, partial product, all-reduce)."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        if weight is None and not torch.compiler.is_compiling():
            return super().forward(x)[0]
        if not self.input_is_parallel:
            x = tensor_parallel.scatter_to_tensor_model_parallel_region(x, group=self.tp_group)
        y = tensor_parallel.reduce_from_tensor_model_parallel_region(
            F.linear(x, self.weight if weight is None else weight), group=self.tp_group)
        return y if self.bias is None else y + self.bias


def init_tensor_parallel(tp_size: int) -> None:
    """megatron's process groups: consecutive ranks form a tensor-parallel group. Their collectives
    time out as every other group's (torch.distributed's default, which set_collective_timeout makes
    parallel.timeout_s), not after megatron's own 30 minutes."""
    if not parallel_state.model_parallel_is_initialized():
        minutes = distributed_c10d.default_pg_timeout.total_seconds() / 60
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp_size, distributed_timeout_minutes=minutes)


class TensorParallelFactory(LayerFactory):
    """Layers for one rank of a tensor-parallel group (call init_tensor_parallel first)."""

    def __init__(self, params_dtype: torch.dtype = torch.float32):
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.group = parallel_state.get_tensor_model_parallel_group()
        self.config = ModelParallelConfig(tensor_model_parallel_size=self.tp_size, use_cpu_initialization=True,
                                          gradient_accumulation_fusion=False, params_dtype=params_dtype)

    def linear(self, in_features: int, out_features: int, *, bias: bool, parallel: Parallel,
               init_std: float, input_is_parallel: bool = True) -> nn.Module:
        init = functools.partial(nn.init.normal_, mean=0.0, std=init_std)
        if parallel == "column":
            return ColumnLinear(in_features, out_features, config=self.config, init_method=init, bias=bias,
                                gather_output=False)
        if parallel == "row":
            return RowLinear(in_features, out_features, config=self.config, init_method=init, bias=bias,
                             input_is_parallel=input_is_parallel, skip_bias_add=False)
        return super().linear(in_features, out_features, bias=bias, parallel=parallel, init_std=init_std)

    def embedding(self, num: int, dim: int, *, parallel: Parallel, init_std: float) -> nn.Module:
        if parallel == "column":
            init = functools.partial(nn.init.normal_, mean=0.0, std=init_std)
            return tensor_parallel.VocabParallelEmbedding(num, dim, init_method=init, config=self.config)
        return super().embedding(num, dim, parallel=parallel, init_std=init_std)

    def shared(self, t: torch.Tensor) -> torch.Tensor:
        """Identity forward; backward sums the gradient over the tensor-parallel group."""
        return tensor_parallel.copy_to_tensor_model_parallel_region(t, group=self.group)

    def lm_logits(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """(B, T, d) x local (V / tp, d) -> (B, T, V / tp); the input's gradient is all-reduced."""
        return F.linear(tensor_parallel.copy_to_tensor_model_parallel_region(h, group=self.group), weight)

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Vocabulary-parallel cross-entropy on this rank's logit shard; padding columns (ids >=
        vocab_size) are masked, targets of -1 ignored; reduced by `loss_weights` (loss_norm token:
        the mean over scored tokens, as before; example: the per-example mean)."""
        if self.loss_norm != "token":
            return self.reduce_losses(self.token_losses(logits, targets, vocab_size), targets)
        valid = targets >= 0
        return self.token_losses(logits, targets, vocab_size).sum() / valid.sum()

    def token_losses(self, logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Per-token (B, T) vocabulary-parallel cross-entropy, 0 where the target is -1."""
        shard = logits.shape[-1]
        first = self.tp_rank * shard
        if first + shard > vocab_size:
            pad = torch.arange(first, first + shard, device=logits.device) >= vocab_size
            logits = logits.masked_fill(pad, float("-inf"))
        # megatron's cross-entropy works in place on its input: never hand it the logits we return
        work = logits.clone() if logits.dtype == torch.float32 else logits.float()
        losses = tensor_parallel.vocab_parallel_cross_entropy(work, targets.clamp(min=0))
        return losses * (targets >= 0)
