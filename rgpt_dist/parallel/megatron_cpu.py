"""The CUDA assumptions of megatron-core that break on CPU-only torch, redirected to CPU equivalents.
Applied only when CUDA is absent; each patch is tested in tests/parallel/test_megatron_cpu.py.

With use_cpu_initialization=True and gradient_accumulation_fusion=False, Column/RowParallelLinear,
VocabParallelEmbedding and the vocabulary-parallel cross-entropy run on gloo as they are. One path we
use does not: the backward of `scatter_to_tensor_model_parallel_region` (a row-parallel layer reading
a replicated input, W_proj here) all-gathers into a buffer allocated on `torch.cuda.current_device()`.
The patch allocates on the input's device instead, which is what the CUDA code does on a GPU.

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


def apply_cpu_compat() -> bool:
    """Patch megatron-core for CPU-only torch; returns whether anything was applied (once)."""
    global _APPLIED
    if torch.cuda.is_available() or _APPLIED:
        return False
    from megatron.core.tensor_parallel import mappings

    # the autograd functions look the helper up in the module at call time
    mappings._gather_along_last_dim = _gather_along_last_dim
    _APPLIED = True
    return True
