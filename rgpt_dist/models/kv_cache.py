"""K/V caches for incremental decoding (SPEC section 5, paper Fig. 7 and Tables 3-4). Plain PyTorch.

Every attention layer takes an optional per-layer cache with `update(k, v) -> (k_all, v_all)`:
k, v are the new tokens' keys and values, (B, H_local, T_new, head_dim), and k_all, v_all are the
keys and values the new tokens attend to, (B, H_local, P + T_new, head_dim), past first. H_local is
whatever the layer's (possibly tensor-parallel) qkv projection produced, so the cache never needs
the head count.

Non-shared blocks (GPT-2's blocks, RecurrentGPT's prelude and coda) append to a `LayerCache`.
The shared core blocks of RecurrentGPT, run r times per forward, use one of four strategies:

    full     one LayerCache per (recurrence step, core block): exact, r x the core's memory
    first    one CompressedLayerCache per core block, storing each token's step-0 K/V
    last     ... storing each token's step-(r-1) K/V
    average  ... storing each token's mean K/V over the r steps (summed in fp32, or fp64 for fp64)

With a compressed cache, the new tokens of a forward attend at step i to [past tokens' stored
K/V, their own exact step-i K/V]; the stored entry for the new tokens is appended only when the
forward ends (`KVCache.end`). A prompt prefilled in one call therefore attends exactly within
itself; only later tokens see compressed history.

Storage is appended with torch.cat, so every held tensor owns exactly its storage and `nbytes()`
is what is allocated. A cache is made for one depth r (`model.make_cache(strategy, r)`) and every
forward on it must use that r.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

STRATEGIES = ("full", "first", "last", "average")


def _append(past: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """past (B, H, P, hd) + new (B, H, T, hd) -> a fresh contiguous (B, H, P + T, hd). A copy also
    when past is None: new is usually a strided view of the whole qkv output, which it would pin."""
    if past is None:
        return new.clone(memory_format=torch.contiguous_format)
    return torch.cat([past, new], dim=2)


class LayerCache:
    """An ordinary per-layer cache: every token's K/V, appended as tokens arrive. `keys`/`values`
    and `update` are the names transformers' DynamicLayer uses, so a KVCache can store its K/V in
    either (the Hugging Face export stores them in DynamicLayers, see `KVCache(store=...)`)."""

    def __init__(self):
        self.keys: torch.Tensor | None = None  # (B, H_local, length, head_dim)
        self.values: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys, self.values = _append(self.keys, k), _append(self.values, v)
        return self.keys, self.values


def _held(store: Any) -> list[torch.Tensor]:
    """The non-empty K/V tensors a store holds."""
    return [t for t in (store.keys, store.values) if t is not None and t.numel() > 0]


class CompressedLayerCache:
    """One shared core block's cache under `first`, `last` or `average`: one K/V per token for all
    steps, kept in `store`. `update` is called once per recurrence step of a forward; `commit` at
    its end appends the new tokens' compressed K/V to the store."""

    def __init__(self, strategy: str, store: Any):
        self.strategy, self.store = strategy, store
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None  # this forward's new K/V so far
        self._steps = 0

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.strategy == "average":  # running sum in >= fp32, divided by the step count at commit
            acc = torch.promote_types(k.dtype, torch.float32)
            k_acc, v_acc = k.to(acc), v.to(acc)
            self._pending = (k_acc, v_acc) if self._pending is None else \
                (self._pending[0] + k_acc, self._pending[1] + v_acc)
        elif self.strategy == "last" or self._pending is None:
            self._pending = (k, v)
        self._steps, self._dtype = self._steps + 1, k.dtype
        if not _held(self.store):
            return k, v
        return torch.cat([self.store.keys, k], dim=2), torch.cat([self.store.values, v], dim=2)

    def commit(self) -> None:
        """Appends the new tokens' stored K/V and resets for the next forward."""
        if self._pending is None:
            return
        k, v = self._pending
        if self.strategy == "average":
            k, v = (k / self._steps).to(self._dtype), (v / self._steps).to(self._dtype)
        self.store.update(k, v)
        self._pending, self._steps = None, 0


class KVCache:
    """A model's whole cache: `layers` for the non-shared blocks in execution order (GPT-2's blocks,
    or the prelude then the coda) and `core` for the shared core blocks.

    Protocol for a forward on T_new tokens: `past = cache.begin(T_new, r, training)` (validates,
    changes nothing), attention layers call `update` on `layers[j]` / `core_step(i)[j]`, then
    `cache.end(T_new)` commits compressed entries and advances `length`. `store` makes each layer's
    storage (anything with `keys`, `values` and an appending `update`): LayerCache by default.
    """

    def __init__(self, n_layers: int, n_core: int = 0, strategy: str = "full", r: int | None = None,
                 block_size: int | None = None, store: Callable[[], Any] = LayerCache):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown KV-cache strategy {strategy!r}; expected one of {STRATEGIES}")
        self.strategy, self.r, self.block_size = strategy, r, block_size
        self.length = 0
        self.layers = [store() for _ in range(n_layers)]
        if strategy == "full":  # [step][core block]
            self.core = [[store() for _ in range(n_core)] for _ in range(r or 0)]
        else:
            self.core = [[CompressedLayerCache(strategy, store()) for _ in range(n_core)] for _ in range(min(r or 0, 1))]

    def core_step(self, i: int) -> list:
        """The caches core blocks use at recurrence step i (the same ones at every step unless full)."""
        return self.core[i if self.strategy == "full" else 0]

    def begin(self, t_new: int, r: int | None, training: bool) -> int:
        """Checks a forward of t_new tokens at depth r may use this cache; returns the past length."""
        if training:
            raise ValueError("KV caches are for inference: call model.eval() before passing a cache")
        if r != self.r:
            raise ValueError(f"this KV cache was made for depth r={self.r}, got r={r}; "
                             "make a new cache (model.make_cache(strategy, r)) for another depth")
        if self.block_size is not None and self.length + t_new > self.block_size:
            raise ValueError(f"KV cache holds {self.length} tokens; {t_new} more exceed block_size={self.block_size}")
        return self.length

    def end(self, t_new: int) -> None:
        for step in self.core:
            for layer in step:
                if isinstance(layer, CompressedLayerCache):
                    layer.commit()
        self.length += t_new

    def stores(self) -> list:
        """Every layer's storage, non-shared blocks first."""
        return self.layers + [getattr(c, "store", c) for step in self.core for c in step]

    def tensors(self) -> list[torch.Tensor]:
        """Every K/V tensor held."""
        return [t for store in self.stores() for t in _held(store)]

    def nbytes(self) -> int:
        """Exact bytes of the K/V tensors held (each owns its storage: see `_append`)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())
