"""The CUDA assumptions of megatron-core that break on CPU-only torch, redirected to CPU equivalents.
Applied only when CUDA is absent; each patch is tested in tests/parallel/test_megatron_cpu.py.

So far the tensor-parallel layers need none: with use_cpu_initialization=True and
gradient_accumulation_fusion=False, Column/RowParallelLinear, VocabParallelEmbedding and the
vocabulary-parallel cross-entropy run on gloo as they are (ENVIRONMENT.md agrees). The RNG tracker
(`model_parallel_cuda_manual_seed`) is the known next one; it is not used, because our noise is keyed
rather than drawn from per-rank RNG streams.
"""
from __future__ import annotations

import torch

_APPLIED = False


def apply_cpu_compat() -> bool:
    """Patch megatron-core for CPU-only torch; returns whether anything was applied."""
    global _APPLIED
    if torch.cuda.is_available() or _APPLIED:
        return False
    _APPLIED = True
    return True
