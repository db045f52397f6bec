"""Heavy-tail Poisson depth (Huginn-style, Geiping et al. 2025; SPEC section 4) on the shared
prelude/core/coda skeleton (rgpt_dist.models.looped).

    e      = prelude(wte(idx) + wpe(pos))                    (B, T, d), the injected input
    s^(0)  ~ N(0, state_std^2)                               the state starts from noise
    step i = 1..r:
      s^(i) = core(W_s s^(i-1) + W_e e)                      adapter([s, e]): 2d -> d, no gate
    logits = head(coda(s^(r)))                               (B, T, V)

Training draws r = Poisson(exp(t)) + 1, t ~ N(log(E[r] - 1) - s^2/2, s) per optimizer step (the
spec's sampler) and backpropagates through the last min(r, k) steps only (k = cfg.grad_depth: k_max,
or k_frac x the mean depth): the steps before run without autograd, so they store nothing and cost
no backward. s^(0) is keyed noise in training
(recomputation redraws it); at evaluation it is one fixed draw per position (same for every batch
row), so evaluation is reproducible and cached decoding equals uncached.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from rgpt_dist.models.kv_cache import LayerCache
from rgpt_dist.models.layers import Block, LayerFactory
from rgpt_dist.models.looped import LoopedLM
from rgpt_dist.models.poisson.config import PoissonConfig
from rgpt_dist.noise import NoiseKey
from rgpt_dist.seeding import derive_seed


class InjectedCore(nn.Module):
    """One recurrence step: s_next = core(W_s s + W_e e). The e half is step-invariant: `anchor`
    computes it once per forward."""

    def __init__(self, cfg: PoissonConfig, factory: LayerFactory, out_std: float):
        super().__init__()
        d, std = cfg.d_model, cfg.init_std
        # adapter([s, e]) as two d x d halves, row-parallel on their replicated inputs (like W_proj)
        self.adapt_s = factory.linear(d, d, bias=False, parallel="row", input_is_parallel=False, init_std=std)
        self.adapt_e = factory.linear(d, d, bias=False, parallel="row", input_is_parallel=False, init_std=std)
        self.blocks = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_rec))

    def anchor(self, e: torch.Tensor) -> torch.Tensor:
        return self.adapt_e(e)                                             # (B, T, d)

    def forward(self, s: torch.Tensor, anchor: torch.Tensor, i: int, key: NoiseKey | None,
                caches: list[LayerCache] | None = None, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """s: (B, T, d) state; anchor: W_e e; i: the step (same weights at every step); key: unused
        (no per-step noise); caches: this step's K/V cache of each core block, or None; mask: for
        padded batches."""
        x = self.adapt_s(s) + anchor
        for block, cache in zip(self.blocks, caches or [None] * len(self.blocks)):
            x = block(x, cache, None, mask)
        return x, None


class PoissonDepthGPT(LoopedLM):
    def __init__(self, cfg: PoissonConfig, factory: LayerFactory | None = None):
        super().__init__(cfg, factory, lambda factory, out_std: InjectedCore(cfg, factory, out_std))
        self._eval_state: torch.Tensor | None = None  # (k x block_size, d), kept on the device and dtype last used

    def grad_steps(self, r: int) -> int:
        return min(r, self.cfg.grad_depth)

    def start(self, e: torch.Tensor, r: int, noise_key: NoiseKey | None, past: int,
              positions: torch.Tensor | None = None):
        """(s^(0), W_e e): training noise keyed like every other draw; evaluation: a fixed draw per
        position (past..past + T - 1, or `positions`), drawn on the CPU so every device sees the
        same numbers."""
        B, T, d = e.shape
        if noise_key is not None:
            s = noise_key.normal("state", (B, T, d), self.cfg.state_std, e.device, e.dtype)
        else:
            table = self._eval_state
            # rows the positions may reach: past + T bounds them (padded batches' positions count
            # real tokens only); read as a tensor, they would sync and break the compiled decode graph
            need = self.cfg.block_size if getattr(self.cfg, "pos_encoding", "learned") == "learned" else past + T
            if table is None or (table.device, table.dtype) != (e.device, e.dtype) or table.shape[0] < need:
                # once, not per decoding step; block_size rows per chunk, chunk i drawn from seed
                # derive_seed(i, ...), so the first block_size rows are always the same (chunk 0 is
                # the whole table with pos_encoding=learned, which has no position past block_size)
                chunks = []
                for i in range(-(-max(need, self.cfg.block_size) // self.cfg.block_size)):
                    gen = torch.Generator().manual_seed(derive_seed(i, "poisson-eval-state"))
                    chunks.append(torch.randn(self.cfg.block_size, d, generator=gen) * self.cfg.state_std)
                self._eval_state = table = torch.cat(chunks).to(e.device, e.dtype)
            s = table[past:past + T].expand(B, T, d) if positions is None else table[positions]
        return s, self.recurrence.anchor(e) if r > 0 else None
