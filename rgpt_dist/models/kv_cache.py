"""K/V caches for incremental decoding (SPEC section 5, paper Fig. 7 and Tables 3-4). Plain PyTorch.

Every attention layer takes an optional per-layer cache with `update(k, v) -> (k_all, v_all)`:
k, v are the new tokens' keys and values, (B, H_local, T_new, head_dim), and k_all, v_all are the
keys and values the new tokens attend to, (B, H_local, P + T_new, head_dim), past first. H_local is
whatever the layer's (possibly tensor-parallel) qkv projection produced, so the cache never needs
the head count.

Non-shared blocks (GPT-2's blocks, RecurrentGPT's prelude and coda) append to a per-layer store.
The shared core blocks of RecurrentGPT, run r times per forward, use one of four strategies:

    full     one store per (recurrence step, core block): exact, r x the core's memory
    first    one CompressedLayerCache per core block, storing each token's step-0 K/V
    last     ... storing each token's step-(r-1) K/V
    average  ... storing each token's mean K/V over the r steps (summed in fp32, or fp64 for fp64)

With a compressed cache, the new tokens of a forward attend at step i to [past tokens' stored
K/V, their own exact step-i K/V]; the stored entry for the new tokens is written only when the
forward ends (`KVCache.end`). A prompt prefilled in one call therefore attends exactly within
itself; only later tokens see compressed history.

Two kinds of store:
  * StaticLayerCache (`KVCache(max_len=...)`, what `model.make_cache` builds): K/V buffers of
    max_len tokens, allocated by the first forward and written in place. A decode step copies only
    its own token's K/V and allocates nothing in the cache (torch.cat would copy the whole past
    every token, O(T^2) in all, and reallocate, which also rules out CUDA graphs). Attention gets
    views [:, :, :P + T] of the buffers, so it sees exactly the held tokens (no padding to mask).
    `nbytes()` is the allocated capacity.
  * LayerCache (`KVCache()` without max_len) or any `store=` with transformers' DynamicLayer
    interface (`keys`, `values`, appending `update`: the Hugging Face export's): appended with
    torch.cat, so every held tensor owns exactly its storage and `nbytes()` is the tokens held.
Both give the same outputs.

Fixed-shape decoding (`KVCache(max_len=..., fixed=True)`, what a compiled decode step uses: see
rgpt_dist.models.generate): while `cache.slots.index` holds the new tokens' positions (T,) as a
tensor, a static store writes there with `index_copy_` and attention gets the whole buffers
(B, H_local, max_len, hd), with the forward's `mask` hiding the positions after the new tokens.
Every decode step then has the same shapes and no position enters the graph as a Python int, so
one compiled graph (and one CUDA graph) serves every token. The buffers start zeroed (a masked key
of NaN garbage would still poison SDPA's weighted sum) and, on CUDA, are marked static addresses so
CUDA graphs may write them in place.

A cache is made for one depth r (`model.make_cache(strategy, r)`) and
every forward on it must use that r. The in-place writes make the static cache for inference
under torch.no_grad() (autograd through a buffer overwritten later would fail in backward).
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
    """A dynamic per-layer cache: every token's K/V, appended as tokens arrive. `keys`/`values`
    and `update` are the names transformers' DynamicLayer uses, so a KVCache can store its K/V in
    either (the Hugging Face export stores them in DynamicLayers, see `KVCache(store=...)`)."""

    def __init__(self):
        self.keys: torch.Tensor | None = None  # (B, H_local, length, head_dim)
        self.values: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys, self.values = _append(self.keys, k), _append(self.values, v)
        return self.keys, self.values


class StaticLayerCache:
    """A preallocated per-layer cache of max_len tokens. The buffers (B, H_local, max_len, head_dim)
    are allocated by the first write, taking batch, heads, head_dim, dtype and device from its k/v
    (the cache needs no model shapes); later writes copy into [length, length + T) in place."""

    def __init__(self, max_len: int, slots: "Slots | None" = None):
        self.max_len, self.length, self.slots = max_len, 0, slots
        self.k_buf: torch.Tensor | None = None  # (B, H_local, max_len, head_dim)
        self.v_buf: torch.Tensor | None = None

    @property
    def keys(self) -> torch.Tensor | None:
        """The held keys, a view (B, H_local, length, head_dim) of the buffer."""
        return None if self.k_buf is None else self.k_buf[:, :, :self.length]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self.v_buf is None else self.v_buf[:, :, :self.length]

    def buffers(self) -> list[torch.Tensor]:
        return [] if self.k_buf is None else [self.k_buf, self.v_buf]

    def _write(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies k, v (B, H_local, T, hd) to positions [length, length + T) without advancing
        length; returns the views (B, H_local, length + T, hd) of everything up to them."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"static KV cache of capacity max_len={self.max_len} holds {self.length} tokens; "
                             f"{k.shape[2]} more do not fit")
        if self.k_buf is None:
            self._allocate(k, v)
        elif k.shape[:2] != self.k_buf.shape[:2] or k.shape[3] != self.k_buf.shape[3]:
            # (a batch of 1 would otherwise broadcast silently into every row)
            raise ValueError(f"K/V of shape {tuple(k.shape)} do not fit this cache's buffers "
                             f"{tuple(self.k_buf.shape)} (batch, heads, -, head_dim)")
        if self.slots is not None and self.slots.index is not None:  # fixed shapes: see the module doc
            self.k_buf.index_copy_(2, self.slots.index, k)
            self.v_buf.index_copy_(2, self.slots.index, v)
            return self.k_buf, self.v_buf
        self.k_buf[:, :, self.length:end] = k
        self.v_buf[:, :, self.length:end] = v
        return self.k_buf[:, :, :end], self.v_buf[:, :, :end]

    def _allocate(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Buffers (B, H_local, max_len, hd) shaped after the first k, v. Fixed-shape ones are
        zeroed (attention reads them whole) and static for CUDA graphs."""
        B, H, _, hd = k.shape
        new = k.new_empty if self.slots is None else k.new_zeros
        self.k_buf, self.v_buf = new((B, H, self.max_len, hd)), new((B, H, self.max_len, v.shape[3]))
        if self.slots is not None and k.is_cuda:
            torch._dynamo.mark_static_address(self.k_buf)
            torch._dynamo.mark_static_address(self.v_buf)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends k, v (B, H_local, T, hd): returns views of all held K/V, (B, H_local, P + T, hd)."""
        out = self._write(k, v)
        self.length += k.shape[2]
        return out

    def stage(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Like update, but the new tokens are not kept: the next stage or update overwrites them
        unless `keep` follows. A compressed cache stages each recurrence step's exact K/V."""
        return self._write(k, v)

    def keep(self, t_new: int) -> None:
        """Keeps the t_new tokens staged last (`last` keeps the final step's K/V without a copy)."""
        self.length += t_new


class Slots:
    """The positions a fixed-shape cache's static stores write the new tokens to: `index`, a (T,)
    long tensor on the cache's device, or None to append at each store's length (the prefill)."""

    def __init__(self):
        self.index: torch.Tensor | None = None


def _held(store: Any) -> list[torch.Tensor]:
    """The K/V tensors a store holds: a static store's buffers (whole capacity) once allocated, or
    a dynamic store's non-empty keys and values."""
    if isinstance(store, StaticLayerCache):
        return store.buffers()
    return [t for t in (store.keys, store.values) if t is not None and t.numel() > 0]


def new_positions(cache: Any, t_new: int, device: torch.device) -> torch.Tensor:
    """The positions (T,) of a forward's t_new new tokens, for position encodings inside attention
    (RoPE, ALiBi): the tokens a layer's cache holds come first, so read before its update. A
    fixed-shape store's `slots.index` when set; else the store's held length (a compressed cache's
    committed tokens; a DynamicLayer's keys, cropped or not); 0 without a cache."""
    store = getattr(cache, "store", cache)  # a CompressedLayerCache keeps its tokens in `store`
    past = 0
    if isinstance(store, StaticLayerCache):
        if store.slots is not None and store.slots.index is not None:
            return store.slots.index
        past = store.length
    elif store is not None and getattr(store, "keys", None) is not None and store.keys.numel() > 0:
        past = store.keys.shape[-2]
    return torch.arange(past, past + t_new, device=device)


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
            self._pending = (k, v)  # (views of this step's qkv output: never overwritten)
        self._steps, self._dtype = self._steps + 1, k.dtype
        if isinstance(self.store, StaticLayerCache):  # [stored past, this step's exact K/V], in place
            return self.store.stage(k, v)
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
        if self.strategy == "last" and isinstance(self.store, StaticLayerCache):
            self.store.keep(k.shape[2])  # the last step's K/V are the staged ones
        else:
            self.store.update(k, v)  # (static: overwrites the last staged step's K/V in place)
        self._pending, self._steps = None, 0


class KVCache:
    """A model's whole cache: `layers` for the non-shared blocks in execution order (GPT-2's blocks,
    or the prelude then the coda) and `core` for the shared core blocks.

    Protocol for a forward on T_new tokens: `past = cache.begin(T_new, r, training)` (validates,
    changes nothing), attention layers call `update` on `layers[j]` / `core_step(i)[j]`, then
    `cache.end(T_new)` commits compressed entries and advances `length`.

    max_len: preallocated storage of that many tokens per layer (StaticLayerCache; at most
    block_size); fixed: its stores also take positions from `slots` (fixed-shape decoding).
    Otherwise `store` makes each layer's dynamic storage (anything with `keys`,
    `values` and an appending `update`): LayerCache by default.
    """

    def __init__(self, n_layers: int, n_core: int = 0, strategy: str = "full", r: int | None = None,
                 block_size: int | None = None, store: Callable[[], Any] | None = None, max_len: int | None = None,
                 fixed: bool = False):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown KV-cache strategy {strategy!r}; expected one of {STRATEGIES}")
        self.slots: Slots | None = None
        if max_len is not None:
            if store is not None:
                raise ValueError("pass either max_len (a static cache) or store (dynamic storage), not both")
            if not 1 <= max_len <= (block_size or max_len):
                raise ValueError(f"KV cache max_len={max_len} must be in [1, block_size={block_size}]")
            slots = self.slots = Slots() if fixed else None
            store = lambda: StaticLayerCache(max_len, slots)  # noqa: E731
        elif fixed:
            raise ValueError("a fixed-shape KV cache needs max_len (static storage)")
        self.strategy, self.r, self.block_size, self.max_len = strategy, r, block_size, max_len
        self.length = 0
        self.carry: Any = None
        """A family's own state carried from one forward to the next beyond per-token K/V stores
        (RLT's decoder window rings and fed-back state: rgpt_dist.models.rlt.cache), made by the
        model's first forward on the cache; None for caches of K/V stores only. Its `tensors()`
        count in tensors() and nbytes()."""
        store = store or LayerCache
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
        if self.max_len is not None and self.length + t_new > self.max_len:
            raise ValueError(f"KV cache holds {self.length} tokens; {t_new} more exceed its capacity "
                             f"max_len={self.max_len} (make_cache(..., max_len=) sets it)")
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
        """Every K/V tensor held: a static cache's whole buffers, a dynamic cache's held tokens
        (then the carry's tensors, if any)."""
        carried = [] if self.carry is None else self.carry.tensors()
        return [t for store in self.stores() for t in _held(store)] + carried

    def nbytes(self) -> int:
        """Bytes of K/V storage held. Static (max_len): the allocated capacity, B x H x max_len x
        head_dim per buffer from the first forward on (0 before it), however many tokens are held.
        Dynamic: exactly the tokens held (each tensor owns its storage: see `_append`)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())
