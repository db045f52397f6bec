"""The K/V cache of an exported prelude/core/coda model (see modeling_rgpt.py): the native KVCache
(kv_cache.py, shipped with the model) storing its K/V in transformers' DynamicLayers, one per
prelude and coda block, and for the shared core one per (recurrence step, block) with kv_strategy
`full` or one compressed slot per block with `first`, `last`, `average`. Being a transformers
`Cache` over those layers, beam search (reorder_cache), batch selection and crop work unchanged."""
from __future__ import annotations

import inspect
from typing import Callable, Optional

from transformers.cache_utils import Cache, DynamicLayer

from .configuration_rgpt import RGPTConfig, check_kv_strategy, check_r_eval
from .kv_cache import KVCache

# transformers 5 crops by a count of tokens to remove (crop(-n), crop(0) a no-op, positive refused);
# 4.x by the length to keep (crop(n), negative = remove)
_CROP_REMOVES = "tokens_to_remove" in inspect.signature(DynamicLayer.crop).parameters


class RGPTCache(Cache):
    """`kv`: the native cache the model's forward takes; `layers`: its DynamicLayer stores."""

    def __init__(self, config: RGPTConfig, r: Optional[int] = None, strategy: Optional[str] = None,
                 make_kv: Optional[Callable[..., KVCache]] = None):
        """make_kv(strategy, r, store=...): the native model's make_cache (a family may lay its cache
        out its own way: Mixture-of-Recursions adds a route store per step); KVCache's layout if None."""
        self.r = check_r_eval(config.r_eval if r is None else r, config.max_eval_depth)
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
        under 5.x crop(0) removes none and a positive value is refused (as its DynamicLayer does)."""
        if length < 0 or (length == 0 and _CROP_REMOVES):
            keep = self.kv.length + length
        elif _CROP_REMOVES:
            raise ValueError(f"crop({length}): pass a negative number of tokens to remove")
        else:
            keep = length
        keep = max(0, min(keep, self.kv.length))
        for layer in self.layers:  # every initialized layer holds one entry per token
            if layer.is_initialized and layer.keys.shape[-2] > keep:
                layer.keys, layer.values = layer.keys[..., :keep, :], layer.values[..., :keep, :]
        self.kv.length = keep

    def nbytes(self) -> int:
        """Exact bytes of K/V tensors held (every stored tensor owns its storage: appended by torch.cat)."""
        return self.kv.nbytes()
