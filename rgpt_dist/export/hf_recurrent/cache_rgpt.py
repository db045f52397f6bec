"""The K/V cache of the trust_remote_code RecurrentGPT (see modeling_rgpt.py): one DynamicLayer per
prelude and coda block, and for the shared core one per (recurrence step, block) with kv_strategy
`full` or one compressed slot per block with `first`, `last`, `average`."""
from __future__ import annotations

import inspect
from typing import Optional

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .configuration_rgpt import RecurrentGPTHFConfig, check_kv_strategy, check_r_eval

# transformers 5 crops by a count of tokens to remove (crop(-n), crop(0) a no-op, positive refused);
# 4.x by the length to keep (crop(n), negative = remove)
_CROP_REMOVES = "tokens_to_remove" in inspect.signature(DynamicLayer.crop).parameters


class _CompressedSlot:
    """One shared core block's K/V during a forward under first/last/average. `update` is called at
    every recurrence step: the new tokens attend to [stored past, their own step-i K/V]; `commit`
    appends their compressed K/V (first step, last step, or the mean, summed in >= fp32)."""

    def __init__(self, layer: DynamicLayer, strategy: str):
        self.layer, self.strategy = layer, strategy
        self.pending: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self.steps, self.dtype = 0, None

    def update(self, k: torch.Tensor, v: torch.Tensor, cache_kwargs=None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.strategy == "average":
            acc = torch.promote_types(k.dtype, torch.float32)
            ka, va = k.to(acc), v.to(acc)
            self.pending = (ka, va) if self.pending is None else (self.pending[0] + ka, self.pending[1] + va)
        elif self.strategy == "last" or self.pending is None:
            self.pending = (k, v)
        self.steps, self.dtype = self.steps + 1, k.dtype
        if self.layer.get_seq_length() == 0:
            return k, v
        return torch.cat([self.layer.keys, k], dim=-2), torch.cat([self.layer.values, v], dim=-2)

    def commit(self) -> None:
        if self.pending is None:
            return
        k, v = self.pending
        if self.strategy == "average":
            k, v = (k / self.steps).to(self.dtype), (v / self.steps).to(self.dtype)
        self.layer.update(k, v)  # torch.cat: the stored tensors own their storage


class RecurrentGPTCache(Cache):
    """K/V cache of one RecurrentGPT for forwards at one depth r and one strategy.

    `layers` (transformers DynamicLayer, each (B, n_head, length, head_dim) keys and values): prelude
    blocks, coda blocks, then the core: r x n_rec (step-major) with `full`, n_rec otherwise (none at
    r = 0 with `full`; unused at r = 0 otherwise). Protocol of a forward on T new tokens:
    `begin(T, r)`, attention layers call `update` on `prelude_kv(j)`, `core_kv(i)[j]`, `coda_kv(j)`,
    then `end(T)` commits compressed entries and advances the length.
    """

    def __init__(self, config: RecurrentGPTHFConfig, r: Optional[int] = None, strategy: Optional[str] = None):
        self.r = check_r_eval(config.r_eval if r is None else r)
        self.strategy = check_kv_strategy(config.kv_strategy if strategy is None else strategy)
        self.n_pre, self.n_rec, self.n_coda = config.n_pre, config.n_rec, config.n_coda
        self.block_size = config.block_size
        n_core = self.n_rec * (self.r if self.strategy == "full" else min(self.r, 1))
        super().__init__(layers=[DynamicLayer() for _ in range(self.n_pre + self.n_coda + n_core)])
        self.seq_len = 0
        self._slots: Optional[list[_CompressedSlot]] = None

    # -- the forward protocol
    def begin(self, t_new: int, r: int) -> int:
        """Checks a forward of t_new tokens at depth r may use this cache; returns the past length."""
        if r != self.r:
            raise ValueError(f"this KV cache was made for depth r={self.r}, got r={r}; use a new cache "
                             "(model.make_cache(r=...)) or the same depth on every call")
        if self.seq_len + t_new > self.block_size:
            raise ValueError(f"KV cache holds {self.seq_len} tokens; {t_new} more exceed block_size={self.block_size}")
        if self.strategy != "full":
            base = self.n_pre + self.n_coda
            self._slots = [_CompressedSlot(self.layers[base + j], self.strategy)
                           for j in range(self.n_rec if self.r > 0 else 0)]
        return self.seq_len

    def prelude_kv(self, j: int) -> DynamicLayer:
        return self.layers[j]

    def coda_kv(self, j: int) -> DynamicLayer:
        return self.layers[self.n_pre + j]

    def core_kv(self, i: int) -> list:
        """The K/V slots of the n_rec core blocks at recurrence step i."""
        if self.strategy == "full":
            base = self.n_pre + self.n_coda + i * self.n_rec
            return self.layers[base: base + self.n_rec]
        return self._slots

    def end(self, t_new: int) -> None:
        for slot in self._slots or []:
            slot.commit()
        self._slots = None
        self.seq_len += t_new

    # -- transformers' Cache interface
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seq_len

    def crop(self, length: int) -> None:
        """Drops the newest tokens: crop(-n) removes n; crop(n >= 0) keeps n under transformers 4.x,
        under 5.x crop(0) removes none and a positive value is refused (as its DynamicLayer does)."""
        if length < 0 or (length == 0 and _CROP_REMOVES):
            keep = self.seq_len + length
        elif _CROP_REMOVES:
            raise ValueError(f"crop({length}): pass a negative number of tokens to remove")
        else:
            keep = length
        keep = max(0, min(keep, self.seq_len))
        for layer in self.layers:  # every initialized layer holds one entry per token
            if layer.is_initialized and layer.keys.shape[-2] > keep:
                layer.keys, layer.values = layer.keys[..., :keep, :], layer.values[..., :keep, :]
        self.seq_len = keep

    def nbytes(self) -> int:
        """Exact bytes of K/V tensors held (every stored tensor owns its storage: appended by torch.cat)."""
        total = 0
        for layer in self.layers:
            if layer.is_initialized:
                total += layer.keys.numel() * layer.keys.element_size()
                total += layer.values.numel() * layer.values.element_size()
        return total
