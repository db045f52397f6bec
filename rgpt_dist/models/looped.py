"""The prelude / shared core / coda skeleton the recurrent families share. Plain PyTorch.

    h       = wte(idx) + wpe(pos)                              (B, T, d)
    h_pre   = prelude(h)                                       n_pre blocks, once
    s, a    = start(h_pre)                                     the family's initial state and anchor
    step i  = 0..r-1:  s = recurrence(s, a, i, key_i, caches)  the family's step (the shared core inside)
    logits  = head(coda(s))                                    (B, T, V)

A family subclasses `LoopedLM`, gives it its `recurrence` module (the unit activation checkpointing
wraps, called r times per forward: everything a step needs, its noise included, is computed inside
it) and overrides `start` and, where it has them, `grad_steps` (truncated backprop) and
`step_statistics`. `readout` (coda + head) is public: evaluation reads every exit through it.
With a KV cache (`make_cache`, inference), idx holds only the tokens after the cached ones; the
shared core's cache keeps every step's K/V (`full`) or one compressed K/V per token (kv_cache.py).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.nn as nn

from rgpt_dist.models.kv_cache import KVCache
from rgpt_dist.models.layers import Block, Embeddings, LayerFactory, LMHead, ModelOutput, residual_std
from rgpt_dist.noise import NoiseKey


class LoopedLM(nn.Module):
    """cfg: a LoopedConfig (n_pre, n_rec, n_loops, n_coda). make_recurrence(factory, out_std) builds
    the family's step module, `recurrence(s, anchor, i, key, caches) -> (s_next, extra)`; modules
    are created in execution order (embeddings, prelude, recurrence, coda, head), so a seed gives
    the same initial weights whatever the family adds."""

    def __init__(self, cfg: Any, factory: LayerFactory | None,
                 make_recurrence: Callable[[LayerFactory, float], nn.Module]):
        super().__init__()
        factory = factory or LayerFactory()
        self.cfg = cfg
        # GPT-2's scaled residual init over the blocks one forward executes at depth R
        out_std = residual_std(cfg, cfg.n_pre + cfg.n_rec * cfg.n_loops + cfg.n_coda)
        self.embed = Embeddings(cfg, factory)
        self.prelude = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_pre))
        self.recurrence = make_recurrence(factory, out_std)
        self.coda = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_coda))
        self.head = LMHead(cfg, factory, self.embed.wte)

    # ---- family hooks -----------------------------------------------------------------------
    def start(self, h_pre: torch.Tensor, r: int, noise_key: NoiseKey | None, past: int,
              positions: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        """(initial state s^(0), anchor passed to every step) from the prelude output (B, T, d) of
        the tokens at positions past..past + T - 1, or at `positions` (B, T) when given."""
        raise NotImplementedError

    def grad_steps(self, r: int) -> int:
        """How many of the last steps carry gradient in training (all: no truncation)."""
        return r

    def step_statistics(self, extra: Any) -> dict[str, torch.Tensor]:
        """Scalar statistics of one step's `extra` output, logged when forward is asked for them."""
        return {}

    def step_aux_loss(self, extra: Any) -> torch.Tensor | None:
        """One step's auxiliary loss from its `extra` output (summed over steps into aux['aux_loss'],
        which the trainer adds to the loss), or None (no auxiliary loss)."""
        return None

    def hidden(self, s: Any) -> torch.Tensor:
        """The hidden state (B, T, d) the coda reads from a step state s (the state itself, unless
        the family carries more in it: Mixture-of-Recursions' routing)."""
        return s

    # ---- shared -----------------------------------------------------------------------------
    def checkpoint_units(self, mode: str) -> list[nn.Module]:
        """Modules whose activations are recomputed in backward: the recurrence step (called r
        times per forward), and with mode 'blocks' also every prelude and coda block."""
        extra = list(self.prelude) + list(self.coda) if mode == "blocks" else []
        return [self.recurrence] + extra

    def make_cache(self, strategy: str = "full", r: int | None = None, max_len: int | None = None,
                   fixed: bool = False, store: Callable[[], Any] | None = None) -> KVCache:
        """An empty KV cache for forwards at depth r (default R): ordinary caches for the prelude and
        coda, and for the shared core one per (step, block) with `full`, or one per block with the
        compressed `first`, `last`, `average` (see rgpt_dist.models.kv_cache). Static: each layer's
        K/V buffers hold max_len tokens (default block_size), allocated by the first forward;
        fixed: for fixed-shape (compiled) decoding (KVCache's `fixed`). store: dynamic storage
        instead (KVCache's `store`: the Hugging Face export's DynamicLayers)."""
        return self._cache(self.cfg.n_rec, strategy, r, max_len, fixed, store)

    def _cache(self, n_core: int, strategy: str, r: int | None, max_len: int | None, fixed: bool,
               store: Callable[[], Any] | None) -> KVCache:
        """make_cache's KVCache with n_core stores per core step."""
        r = self.cfg.n_loops if r is None else int(r)
        if store is not None:
            return KVCache(self.cfg.n_pre + self.cfg.n_coda, n_core, strategy, r, self.cfg.block_size, store=store)
        return KVCache(self.cfg.n_pre + self.cfg.n_coda, n_core, strategy, r, self.cfg.block_size,
                       max_len=self.cfg.block_size if max_len is None else max_len, fixed=fixed)

    def readout(self, h: torch.Tensor, targets: torch.Tensor | None = None, caches: list | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Coda + head on a state h (B, T, d): (logits (B, T, V), loss or None)."""
        for block, cache in zip(self.coda, caches or [None] * len(self.coda)):
            h = block(h, cache, None, mask)
        return self.head(h, targets)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, r: int | None = None,
                all_exits: bool = False, noise_key: NoiseKey | None = None, cache: KVCache | None = None,
                stats: bool = False, mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> ModelOutput:
        """idx, targets: (B, T). r: recurrence depth (default R = n_loops; any r >= 0).
        all_exits: also return aux['exit_losses'] (r + 1,) = loss of coda+head on s^(0..r).
        noise_key: identifies this micro-batch's noise in training (a fresh one if None).
        cache: from `make_cache(strategy, r)`, holding the tokens before idx (inference only, same r
        on every call); idx is appended to it. stats: also return aux['stats'], the family's per-step
        statistics (name -> (r,)). mask, positions: for padded batches (layers.padding_mask)."""
        r = self.cfg.n_loops if r is None else int(r)
        if r < 0:
            raise ValueError(f"recurrence depth r={r} must be >= 0")
        if all_exits and (targets is None or cache is not None):
            raise ValueError("all_exits needs targets (it returns the loss of every exit) and no cache")
        noise_key = None if not self.training else (noise_key or NoiseKey.fresh())
        past = 0 if cache is None else cache.begin(idx.shape[1], r, self.training)
        n_pre = self.cfg.n_pre
        pre_caches, coda_caches = (None, None) if cache is None else (cache.layers[:n_pre], cache.layers[n_pre:])

        h = self.embed(idx, past, positions)                               # (B, T, d)
        for block, block_cache in zip(self.prelude, pre_caches or [None] * n_pre):
            h = block(h, block_cache, None, mask)
        s, anchor = self.start(h, r, noise_key, past, positions)          # (B, T, d), family-specific
        exit_losses = [self.readout(self.hidden(s), targets)[1]] if all_exits and r > 0 else []
        # truncated backprop: the first r - k steps run without autograd (training only)
        no_grad_steps = r - self.grad_steps(r) if self.training and torch.is_grad_enabled() else 0
        per_step: list[dict[str, torch.Tensor]] = []
        aux_losses: list[torch.Tensor] = []
        for i in range(r):
            with torch.no_grad() if i < no_grad_steps else contextlib.nullcontext():
                s, extra = self.recurrence(s, anchor, i, None if noise_key is None else noise_key.at(i),
                                           None if cache is None else cache.core_step(i), mask)
            if stats:
                per_step.append(self.step_statistics(extra))
            if (step_aux := self.step_aux_loss(extra)) is not None:
                aux_losses.append(step_aux)
            if all_exits and i < r - 1:
                exit_losses.append(self.readout(self.hidden(s), targets)[1])
        logits, loss = self.readout(self.hidden(s), targets, coda_caches, mask)
        if cache is not None:
            cache.end(idx.shape[1])
        aux: dict[str, Any] = {"depth": r}
        if aux_losses:
            aux["aux_loss"] = torch.stack(aux_losses).sum()
        if per_step and per_step[0]:  # name -> (r,): one value per step
            aux["stats"] = {k: torch.stack([p[k] for p in per_step]) for k in per_step[0]}
        if all_exits:
            aux["exit_losses"] = torch.stack(exit_losses + [loss])          # (r + 1,)
        return ModelOutput(loss=loss, logits=logits, aux=aux)
