"""Relaxed Recursive Transformer (Bae et al. 2025; SPEC section 4) on the shared prelude/core/coda
skeleton (rgpt_dist.models.looped).

    h^(0) = h_pre = prelude(wte(idx) + wpe(pos))             (B, T, d)
    step i = 1..r (r <= R):
      h^(i) = core_i(h^(i-1))                                 the shared blocks, every projection
                                                              W x + (alpha / rank) B_i A_i x
    logits = head(coda(h^(r)))                                (B, T, V)

One LoRA adapter per (step, core block, projection) on qkv, the attention output, the MLP's fc and
its output projection; B_i starts at zero (training from scratch: every step starts as the strictly
shared block). Depth-fixed: r = R in training; any r <= R at evaluation (early exit).

The update is merged into the weight once per call, W_i = W + (alpha / rank) B_i A_i, so a token
costs one matmul per projection as in a dense block (per token the adapters would cost 32 rank d
FLOPs per block and step in small matmuls; merged they cost 24 rank d^2 per block and step, once).
Under tensor parallelism an adapter takes its projection's split: for a column-parallel projection
B is column-parallel (its rows are the shard's) and A replicated, for a row-parallel one A is
row-parallel (its columns are the shard's) and B replicated; B_shard A or B A_shard is then the
shard of the update, and the replicated factor's gradient is summed over the ranks
(`factory.shared`).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from rgpt_dist.models.kv_cache import LayerCache
from rgpt_dist.models.layers import Block, LayerFactory
from rgpt_dist.models.looped import LoopedLM
from rgpt_dist.models.relaxed.config import RelaxedConfig
from rgpt_dist.noise import NoiseKey


class LoRA(nn.Module):
    """The update of one projection's weight: scale * B A, (out, in) (this rank's shard); A (rank, in)
    ~ N(0, init_std), B (out, rank) = 0."""

    def __init__(self, factory: LayerFactory, in_features: int, out_features: int, cfg: RelaxedConfig,
                 base: str):
        super().__init__()
        self.base, self.factory = base, factory
        split_a, split_b = {"column": ("none", "column"), "row": ("row", "none")}[base]
        self.scale = cfg.lora_alpha / cfg.lora_rank
        self.A = factory.linear(in_features, cfg.lora_rank, bias=False, parallel=split_a, init_std=cfg.init_std)
        self.B = factory.linear(cfg.lora_rank, out_features, bias=False, parallel=split_b, init_std=0.0)

    def forward(self) -> torch.Tensor:
        a, b = self.A.weight, self.B.weight                              # (rank, in), (out, rank): shards
        if self.base == "column":
            a = self.factory.shared(a)
        else:
            b = self.factory.shared(b)
        return (b * self.scale) @ a                                      # (out, in): the weight's shard


def block_adapters(cfg: RelaxedConfig, factory: LayerFactory) -> nn.ModuleDict:
    """One core block's adapters, keyed by the projection names Block passes them to."""
    d = cfg.d_model
    return nn.ModuleDict({"qkv": LoRA(factory, d, 3 * d, cfg, "column"),
                          "attn_proj": LoRA(factory, d, d, cfg, "row"),
                          "fc": LoRA(factory, d, 4 * d, cfg, "column"),
                          "mlp_proj": LoRA(factory, 4 * d, d, cfg, "row")})


class RelaxedCore(nn.Module):
    """The shared core blocks and adapters[step][block]: step i runs the blocks with adapters[i]."""

    def __init__(self, cfg: RelaxedConfig, factory: LayerFactory, out_std: float):
        super().__init__()
        self.blocks = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_rec))
        self.adapters = nn.ModuleList(nn.ModuleList(block_adapters(cfg, factory) for _ in range(cfg.n_rec))
                                      for _ in range(cfg.n_loops))

    def forward(self, h: torch.Tensor, anchor: None, i: int, key: NoiseKey | None,
                caches: list[LayerCache] | None = None, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """h: (B, T, d); i: the step, choosing its adapters; key, anchor: unused (no noise, no
        injection); caches: this step's K/V cache of each core block, or None; mask: for padded
        batches."""
        if i >= len(self.adapters):
            raise ValueError(f"the Relaxed Recursive Transformer has adapters for {len(self.adapters)} steps: "
                             f"depth {i + 1} does not exist (evaluate at r <= {len(self.adapters)})")
        for block, adapters, cache in zip(self.blocks, self.adapters[i], caches or [None] * len(self.blocks)):
            # the updates are formed here, outside the block: a compiled block then reads tensors, not
            # modules (whose ZeRO-3 gathering hooks would run inside its graph)
            h = block(h, cache, {name: lora() for name, lora in adapters.items()}, mask)
        return h, None


class RelaxedRecursiveGPT(LoopedLM):
    def __init__(self, cfg: RelaxedConfig, factory: LayerFactory | None = None):
        super().__init__(cfg, factory, lambda factory, out_std: RelaxedCore(cfg, factory, out_std))

    def start(self, h_pre: torch.Tensor, r: int, noise_key: NoiseKey | None, past: int, positions=None):
        if r > self.cfg.n_loops:
            raise ValueError(f"the Relaxed Recursive Transformer has adapters for R = {self.cfg.n_loops} steps: "
                             f"depth r={r} does not exist (evaluate at r <= {self.cfg.n_loops})")
        return h_pre, None
