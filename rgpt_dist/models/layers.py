"""Building blocks shared by the transformer families: the layer factory, attention, MLP, block,
embeddings and the tied LM head. Plain PyTorch: no process groups, no collective calls.

Tensor parallelism is injected through `LayerFactory`: every linear layer says how it would be split
(`column`: output features sharded, `row`: input features sharded and the output reduced, `none`:
replicated). A row-parallel layer normally reads the sharded output of a column-parallel one;
`input_is_parallel=False` says its input is replicated, and each rank then reads its own slice. The default factory builds plain `nn.Linear`/`nn.Embedding`; the tensor-parallel
factory in rgpt_dist/parallel returns sharded layers with the same call signatures. Modules infer local
sizes (heads, MLP width) from the layers they were given, so the same code runs sharded.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from rgpt_dist.models.kv_cache import LayerCache

Parallel = Literal["column", "row", "none"]


class Linear(nn.Linear):
    """nn.Linear whose forward can take another weight of the same shape (a merged low-rank update:
    W + dW), as the tensor-parallel layers can."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, self.weight if weight is None else weight, self.bias)


class LayerFactory:
    """Creates the layers tensor parallelism must choose at construction (plain torch.nn here)."""

    tp_size: int = 1

    def shared(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor every tensor-parallel rank holds whole, used to build a rank's shard of a weight
        (a low-rank factor): the identity here; under tensor parallelism its gradient is summed
        across the ranks, each of which saw only its shard's part."""
        return t

    def linear(self, in_features: int, out_features: int, *, bias: bool, parallel: Parallel,
               init_std: float, input_is_parallel: bool = True) -> nn.Module:
        layer = Linear(in_features, out_features, bias=bias)
        nn.init.normal_(layer.weight, mean=0.0, std=init_std)
        if bias:
            nn.init.zeros_(layer.bias)
        return layer

    def embedding(self, num: int, dim: int, *, parallel: Parallel, init_std: float) -> nn.Embedding:
        emb = nn.Embedding(num, dim)
        nn.init.normal_(emb.weight, mean=0.0, std=init_std)
        return emb

    def lm_logits(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """(B, T, d) x (V, d) -> (B, T, V): the tied LM head."""
        return F.linear(h, weight)

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Mean next-token loss in fp32 (fp64 for fp64 logits) over the real vocabulary (padding rows
        of the embedding never take probability mass); targets of -1 are ignored."""
        return F.cross_entropy(_real_vocab(logits, vocab_size), targets.flatten(), ignore_index=-1)

    def token_losses(self, logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """(B, T, V) logits, (B, T) targets -> (B, T) next-token losses as in cross_entropy, 0 where
        the target is -1 (for objectives that weight tokens, e.g. Ouro's exits)."""
        losses = F.cross_entropy(_real_vocab(logits, vocab_size), targets.flatten(), ignore_index=-1, reduction="none")
        return losses.view(targets.shape)


def _real_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(..., V_padded) -> (N, vocab_size) in fp32, or the logits' dtype where it is wider (fp64)."""
    logits = logits[..., :vocab_size].flatten(0, -2)
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


@dataclasses.dataclass
class ModelOutput:
    """What every family returns: the training loss, the logits, and family-specific extras
    (gate statistics, auxiliary losses, per-exit losses) that the trainer logs or adds generically."""

    loss: torch.Tensor | None
    logits: torch.Tensor | None
    aux: dict[str, Any] = dataclasses.field(default_factory=dict)


Deltas = Mapping[str, torch.Tensor]
"""Projection name ('qkv', 'attn_proj', 'fc', 'mlp_proj') -> () -> an update of its weight (the
rank's shard, the weight's shape)."""


def _project(layer: nn.Module, x: torch.Tensor, delta: Deltas | None, name: str) -> torch.Tensor:
    """layer(x), or with a weight update layer(x) computed with W + delta[name] (a tensor of the
    weight's shape): one matmul per token as without the update."""
    return layer(x) if delta is None else layer(x, weight=layer.weight + delta[name])


def layer_norm(cfg: Any) -> nn.LayerNorm:
    return nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps, bias=cfg.bias)


def residual_std(cfg: Any, block_executions: int) -> float:
    """GPT-2's scaled init of residual output projections: std / sqrt(2 * blocks executed)."""
    return cfg.init_std / math.sqrt(2 * block_executions)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through SDPA (flash/memory-efficient kernels on GPU).

    The fused qkv projection's output features are laid out per head as [head, (q|k|v), head_dim]
    so that a column shard holds whole heads; `rgpt_dist.models.gpt2.from_hf_state_dict` converts
    from GPT-2's [(q|k|v), head, head_dim] layout.
    """

    def __init__(self, cfg: Any, factory: LayerFactory, out_std: float):
        super().__init__()
        d = cfg.d_model
        self.head_dim = cfg.head_dim
        self.qkv = factory.linear(d, 3 * d, bias=cfg.bias, parallel="column", init_std=cfg.init_std)
        self.proj = factory.linear(d, d, bias=cfg.bias, parallel="row", init_std=out_std)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, delta: Deltas | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d), the new tokens. cache: their past's K/V (rgpt_dist.models.kv_cache), which
        `update` extends with theirs; None attends within x only. delta: low-rank updates added to
        the projections ('qkv', 'attn_proj'), or None. mask: (B, 1, T, P + T) boolean, True where
        a query may attend (padded batches, from `attention_mask`); None: causal."""
        B, T, _ = x.shape
        qkv = _project(self.qkv, x, delta, "qkv").view(B, T, -1, 3, self.head_dim)  # (B, T, H_local, 3, hd)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)                # each (B, H_local, T, hd)
        if cache is not None:
            k, v = cache.update(k, v)                                 # each (B, H_local, P + T, hd)
        past = k.shape[2] - T
        if mask is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # query t sits at position past + t and sees keys 0..past + t (is_causal would align
            # top-left); a single new token sees every key, so it needs no mask (and keeps fast kernels)
            mask = None if T == 1 else \
                torch.arange(T, device=x.device)[:, None] + past >= torch.arange(past + T, device=x.device)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H_local, T, hd)
        return _project(self.proj, y.transpose(1, 2).reshape(B, T, -1), delta, "attn_proj")  # (B, T, d)


class MLP(nn.Module):
    """d -> 4d -> d with GPT-2's tanh-approximated GELU."""

    def __init__(self, cfg: Any, factory: LayerFactory, out_std: float):
        super().__init__()
        d = cfg.d_model
        self.fc = factory.linear(d, 4 * d, bias=cfg.bias, parallel="column", init_std=cfg.init_std)
        self.proj = factory.linear(4 * d, d, bias=cfg.bias, parallel="row", init_std=out_std)

    def forward(self, x: torch.Tensor, delta: Deltas | None = None) -> torch.Tensor:
        """delta: low-rank updates of 'fc' and 'mlp_proj', or None."""
        return _project(self.proj, F.gelu(_project(self.fc, x, delta, "fc"), approximate="tanh"), delta, "mlp_proj")


class Block(nn.Module):
    """GPT-2 pre-norm block: x + attn(LN(x)), then x + mlp(LN(x))."""

    def __init__(self, cfg: Any, factory: LayerFactory, out_std: float):
        super().__init__()
        self.ln_1 = layer_norm(cfg)
        self.attn = CausalSelfAttention(cfg, factory, out_std)
        self.ln_2 = layer_norm(cfg)
        self.mlp = MLP(cfg, factory, out_std)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, delta: Deltas | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """delta: per-projection low-rank updates (Relaxed Recursive Transformer's per-step LoRA);
        mask: see CausalSelfAttention."""
        x = x + self.attn(self.ln_1(x), cache, delta, mask)
        return x + self.mlp(self.ln_2(x), delta)


class Embeddings(nn.Module):
    """Token + learned position embeddings: (B, T) ids -> (B, T, d)."""

    def __init__(self, cfg: Any, factory: LayerFactory):
        super().__init__()
        self.block_size = cfg.block_size
        self.wte = factory.embedding(cfg.padded_vocab_size, cfg.d_model, parallel="column", init_std=cfg.init_std)
        self.wpe = factory.embedding(cfg.block_size, cfg.d_model, parallel="none", init_std=cfg.init_std)

    def forward(self, idx: torch.Tensor, start: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """idx: (B, T) tokens at positions start..start + T - 1 (start > 0 after cached tokens), or at
        `positions` (B, T) when given (padded batches count real tokens only)."""
        T = idx.shape[1]
        if start + T > self.block_size:
            raise ValueError(f"sequence length {start + T} exceeds block_size={self.block_size}")
        pos = torch.arange(start, start + T, device=idx.device) if positions is None else positions
        return self.wte(idx) + self.wpe(pos)


def padding_mask(attention_mask: torch.Tensor, t_new: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For a padded batch: attention_mask (B, P + T), 1 for real tokens and 0 for padding, covering
    the P cached and T new tokens -> (mask (B, 1, T, P + T) for the attention layers, positions
    (B, T) of the new tokens counting real tokens only). Padded keys are hidden; every query keeps
    itself, so no row is all False (SDPA would return NaN)."""
    s = attention_mask.shape[1]
    q_pos = torch.arange(s - t_new, s, device=attention_mask.device)[:, None]
    k_pos = torch.arange(s, device=attention_mask.device)[None, :]
    mask = ((k_pos <= q_pos)[None] & attention_mask.bool()[:, None, :]) | (k_pos == q_pos)[None]
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, s - t_new:]
    return mask[:, None], positions


class LMHead(nn.Module):
    """Final LayerNorm and the head tied to the token embedding; computes the loss when given targets."""

    def __init__(self, cfg: Any, factory: LayerFactory, wte: nn.Module):
        super().__init__()
        self.ln_f = layer_norm(cfg)
        self.factory = factory
        self.vocab_size = cfg.vocab_size
        self.wte = [wte]  # a list, so the tied weight is not registered (and counted) twice

    def tied_parameters(self) -> list[nn.Parameter]:
        """Parameters this module reads but another owns: the token embedding."""
        return [self.wte[0].weight]

    def forward(self, h: torch.Tensor, targets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.factory.lm_logits(self.ln_f(h), self.wte[0].weight)  # (B, T, V_padded / tp)
        loss = None if targets is None else self.factory.cross_entropy(logits, targets, self.vocab_size)
        return logits, loss
