"""The K/V cache of an exported prelude/core/coda model (see modeling_rgpt.py): the native KVCache
(kv_cache.py, shipped with the model) storing its K/V in transformers' DynamicLayers, one per
prelude and coda block, and for the shared core one per (recurrence step, block) with kv_strategy
`full` or one compressed slot per block with `first`, `last`, `average`. Being a transformers
`Cache` over those layers, beam search (reorder_cache), batch selection and crop work unchanged.

A family's cache may carry state beyond per-token K/V (`KVCache.carry`: RLT's decoder window rings
and fed-back state, batch-major buffers (B, ...) updated in place): beam search reorders it with the
layers; re-batching it (batch_select_indices, batch_repeat_interleave) and dropping tokens (crop:
assisted generation) are refused, since a recurrent state cannot be rolled back."""
from __future__ import annotations

import inspect
from typing import Callable, Optional

from transformers.cache_utils import Cache, DynamicLayer

from .configuration_rgpt import RGPTConfig, check_kv_strategy
from .kv_cache import KVCache

# transformers 5 crops by a count of tokens to remove (crop(-n), crop(0) a no-op, positive refused);
# 4.x by the length to keep (crop(n), negative = remove)
_CROP_REMOVES = "tokens_to_remove" in inspect.signature(DynamicLayer.crop).parameters


class RGPTCache(Cache):
    """`kv`: the native cache the model's forward takes; `layers`: its DynamicLayer stores."""

    def __init__(self, config: RGPTConfig, r: Optional[int] = None, strategy: Optional[str] = None,
                 make_kv: Optional[Callable[..., KVCache]] = None):
        """make_kv(strategy, r, store=...): the native model's make_cache (a family may lay its cache
        out its own way: Mixture-of-Recursions adds a route store per step; RLT its encoder and
        memory stores, r None); KVCache's layout if None."""
        self.r = config.depth(r)
        self.strategy = check_kv_strategy(config.kv_strategy if strategy is None else strategy)
        stores = []

        def store() -> DynamicLayer:
            stores.append(DynamicLayer())
            return stores[-1]

        if make_kv is not None:
            self.kv = make_kv(self.strategy, self.r, store=store)
        else:
            self.kv = KVCache(config.n_pre + config.n_coda, config.n_rec, self.strategy, self.r, config.block_size,
                              store=store)
        super().__init__(layers=stores)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv.length

    def crop(self, length: int) -> None:
        """Drops the newest tokens: crop(-n) removes n; crop(n >= 0) keeps n under transformers 4.x,
        under 5.x crop(0) removes none and a positive value is refused (as its DynamicLayer does).
        Refused where a carried state would have to be rolled back (module docstring)."""
        if length < 0 or (length == 0 and _CROP_REMOVES):
            keep = self.kv.length + length
        elif _CROP_REMOVES:
            raise ValueError(f"crop({length}): pass a negative number of tokens to remove")
        else:
            keep = length
        keep = max(0, min(keep, self.kv.length))
        if keep < self.kv.length:
            self._refuse_carry(f"crop({length}) (dropping {self.kv.length - keep} of {self.kv.length} tokens)")
        for layer in self.layers:  # every initialized layer holds one entry per token
            if layer.is_initialized and layer.keys.shape[-2] > keep:
                layer.keys, layer.values = layer.keys[..., :keep, :], layer.values[..., :keep, :]
        self.kv.length = keep

    def _refuse_carry(self, what: str) -> None:
        if self.kv.carry is not None:
            raise ValueError(f"{what} is not supported by this model's cache: it carries a recurrent state "
                             f"({type(self.kv.carry).__name__}: RLT's window rings and fed-back state) that cannot "
                             f"be rolled back or re-batched; use greedy, sampling or beam search without an assistant")

    def reorder_cache(self, beam_idx) -> None:
        """Beam search: every layer's K/V and the carried state (in place) follow beam_idx (B,)."""
        super().reorder_cache(beam_idx)
        for t in [] if self.kv.carry is None else self.kv.carry.tensors():  # each (B, ...)
            t.copy_(t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse_carry("batch_repeat_interleave")
        super().batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices) -> None:
        self._refuse_carry("batch_select_indices")
        super().batch_select_indices(indices)

    def nbytes(self) -> int:
        """Exact bytes of K/V tensors held (every stored tensor owns its storage: appended by torch.cat)."""
        return self.kv.nbytes()
