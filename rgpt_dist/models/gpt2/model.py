"""Dense GPT-2 (nanoGPT-style): the baseline of every comparison.

    idx (B, T) -> wte + wpe -> n_layer pre-norm blocks -> LN -> tied head -> logits (B, T, V)

With a KV cache (`make_cache`, inference), idx holds only the tokens after the cached ones.

Initialisation follows GPT-2: N(0, 0.02) weights, zero biases, residual output projections scaled
by 1/sqrt(2 * n_layer); under muP (model.mup_base_width) hidden matrices further by 1/sqrt(m). The
block's options (RMSNorm, SwiGLU, QK-norm, RoPE, muP: the RLT baseline) are the shared layers'.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from rgpt_dist.models.gpt2.config import GPT2Config
from rgpt_dist.models.kv_cache import KVCache
from rgpt_dist.models.layers import Block, Embeddings, LayerFactory, LMHead, ModelOutput, residual_std


class GPT2(nn.Module):
    may_have_unused_params = False  # every parameter receives a gradient every step

    def __init__(self, cfg: GPT2Config, factory: LayerFactory | None = None):
        super().__init__()
        factory = factory or LayerFactory()
        self.cfg = cfg
        out_std = residual_std(cfg, cfg.n_layer)
        self.embed = Embeddings(cfg, factory)
        self.blocks = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_layer))
        self.head = LMHead(cfg, factory, self.embed.wte)

    def checkpoint_units(self, mode: str) -> list[nn.Module]:
        """Modules whose activations are recomputed in backward: every block (any mode)."""
        return list(self.blocks)

    def make_cache(self, strategy: str = "full", r: int | None = None, max_len: int | None = None,
                   fixed: bool = False) -> KVCache:
        """An empty KV cache for `forward(..., cache=)`: one ordinary K/V cache per block. The
        strategy only concerns shared blocks, which a dense model has none of (any known one gives
        the same cache); r must be None. Static: each block's K/V buffers hold max_len tokens
        (default block_size), allocated by the first forward; fixed: for fixed-shape (compiled) decoding
        (see rgpt_dist.models.kv_cache)."""
        if r is not None:
            raise ValueError("GPT2 has no recurrence depth: r is not supported")
        return KVCache(self.cfg.n_layer, strategy=strategy, block_size=self.cfg.block_size,
                       max_len=self.cfg.block_size if max_len is None else max_len, fixed=fixed)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, r: int | None = None,
                all_exits: bool = False, noise_key: object = None, cache: KVCache | None = None,
                stats: bool = False, mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> ModelOutput:
        """idx, targets: (B, T) token ids. `r`, `all_exits`, `noise_key` and `stats` exist for a uniform
        interface across families; a dense model has no recurrence, no noise and no per-step
        statistics. cache: from `make_cache`, holding the tokens before idx (inference only); idx is
        appended to it. mask, positions: for padded batches (layers.padding_mask)."""
        if r is not None or all_exits:
            raise ValueError("GPT2 has no recurrence depth: r and all_exits are not supported")
        T = idx.shape[1]
        past = 0 if cache is None else cache.begin(T, r, self.training)
        caches = [None] * len(self.blocks) if cache is None else cache.layers
        h = self.embed(idx, past, positions)  # (B, T, d)
        for block, layer_cache in zip(self.blocks, caches):
            h = block(h, layer_cache, None, mask)
        logits, loss = self.head(h, targets)
        if cache is not None:
            cache.end(T)
        return ModelOutput(loss=loss, logits=logits)


def from_hf_state_dict(sd: dict[str, torch.Tensor], n_head: int) -> dict[str, torch.Tensor]:
    """Convert a `transformers.GPT2LMHeadModel` state dict to this module's names and layouts:
    Conv1D weights are transposed, and c_attn's [(q|k|v), head, hd] output order becomes
    [head, (q|k|v), hd] (see CausalSelfAttention)."""
    def qkv_to_per_head(t: torch.Tensor) -> torch.Tensor:
        d3 = t.shape[0]
        hd = d3 // 3 // n_head
        return t.view(3, n_head, hd, *t.shape[1:]).transpose(0, 1).reshape(d3, *t.shape[1:])

    out = {"embed.wte.weight": sd["transformer.wte.weight"], "embed.wpe.weight": sd["transformer.wpe.weight"],
           "head.ln_f.weight": sd["transformer.ln_f.weight"], "head.ln_f.bias": sd["transformer.ln_f.bias"]}
    n_layer = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("transformer.h."))
    for i in range(n_layer):
        src, dst = f"transformer.h.{i}.", f"blocks.{i}."
        for ln in ("ln_1", "ln_2"):
            out[dst + f"{ln}.weight"] = sd[src + f"{ln}.weight"]
            out[dst + f"{ln}.bias"] = sd[src + f"{ln}.bias"]
        out[dst + "attn.qkv.weight"] = qkv_to_per_head(sd[src + "attn.c_attn.weight"].t())
        out[dst + "attn.qkv.bias"] = qkv_to_per_head(sd[src + "attn.c_attn.bias"])
        for mine, theirs in (("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")):
            out[dst + f"{mine}.weight"] = sd[src + f"{theirs}.weight"].t()
            out[dst + f"{mine}.bias"] = sd[src + f"{theirs}.bias"]
    return {k: v.contiguous() for k, v in out.items()}
