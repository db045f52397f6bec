"""The CUDA assumptions of megatron-core that break on CPU-only torch, redirected to CPU equivalents.
Applied only when CUDA is absent; each patch is tested in tests/parallel/test_megatron_cpu.py (the
autocast one in tests/parallel/test_precision.py).

With use_cpu_initialization=True and gradient_accumulation_fusion=False, Column/RowParallelLinear,
VocabParallelEmbedding and the vocabulary-parallel cross-entropy run on gloo as they are. One path we
use does not: the backward of `scatter_to_tensor_model_parallel_region` (a row-parallel layer reading
a replicated input, W_proj here) all-gathers into a buffer allocated on `torch.cuda.current_device()`.
The patch allocates on the input's device instead, which is what the CUDA code does on a GPU.
Under torch.autocast (parallel.dtype=bf16-autocast) the linear layers' autograd function is declared
with CUDA's `custom_fwd`/`custom_bwd`, which on a GPU re-enter the forward's autocast state in the
backward; on CPU its backward ran outside autocast and multiplied a bf16 gradient by the fp32 weight
(a dtype error). The patch declares it for CPU autocast instead: the backward's matmuls then run in
bf16 as they do on a GPU.

Known but unused here: the RNG tracker (`model_parallel_cuda_manual_seed`; our noise is keyed, not
drawn from per-rank streams) and sequence parallelism's first-dimension gathers (GPU-only).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_APPLIED = False


def _gather_along_last_dim(input_: torch.Tensor, group) -> torch.Tensor:
    """megatron's `_gather_along_last_dim` with the output on the input's device: (..., n) on each
    of w ranks -> (..., w * n), rank order."""
    world_size = group.size()
    if world_size == 1:
        return input_
    parts = [torch.empty_like(input_) for _ in range(world_size)]
    dist.all_gather(parts, input_.contiguous(), group=group)
    return torch.cat(parts, dim=-1).contiguous()


def _autocast_on_cpu(function: type[torch.autograd.Function]) -> None:
    """Re-declare an autograd function megatron decorated with custom_fwd/custom_bwd for "cuda" with
    the same decorators for "cpu" (its undecorated methods are the decorators' `__wrapped__`)."""
    for name, declare in (("forward", torch.amp.custom_fwd), ("backward", torch.amp.custom_bwd)):
        method = getattr(function, name)
        setattr(function, name, staticmethod(declare(method.__wrapped__, device_type="cpu")))


def apply_cpu_compat() -> bool:
    """Patch megatron-core for CPU-only torch; returns whether anything was applied (once)."""
    global _APPLIED
    if torch.cuda.is_available() or _APPLIED:
        return False
    # megatron-core (seconds to import) only where tensor parallelism runs
    from megatron.core.tensor_parallel import layers, mappings

    # the autograd functions look the helper up in the module at call time
    mappings._gather_along_last_dim = _gather_along_last_dim
    _autocast_on_cpu(layers.LinearWithGradAccumulationAndAsyncCommunication)
    _APPLIED = True
    return True
