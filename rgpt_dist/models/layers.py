"""Building blocks shared by the transformer families: the layer factory, attention, MLP, block,
embeddings and the tied LM head. Plain PyTorch: no process groups, no collective calls.

Tensor parallelism is injected through `LayerFactory`: every linear layer says how it would be split
(`column`: output features sharded, `row`: input features sharded and the output reduced, `none`:
replicated). A row-parallel layer normally reads the sharded output of a column-parallel one;
`input_is_parallel=False` says its input is replicated, and each rank then reads its own slice. The default factory builds plain `nn.Linear`/`nn.Embedding`; the tensor-parallel
factory in rgpt_dist/parallel returns sharded layers with the same call signatures. Modules infer local
sizes (heads, MLP width) from the layers they were given, so the same code runs sharded.

Positions (`cfg.pos_encoding`, docs/models.md): `learned` adds wpe in Embeddings (GPT-2); `rope`
rotates each head's q and k, `alibi` adds a per-head linear distance bias to the attention logits,
`none` relies on causal masking alone, and these three create no position parameter, so nothing in
the layers depends on block_size. RoPE and ALiBi take a token's position to be its index in the
sequence, the past held by a KV cache included (`kv_cache.new_positions`): keys enter a cache
already rotated, and left padding shifts every real token alike, which relative encodings do not see.

Block options (docs/models.md): `cfg.norm` (LayerNorm | RMSNorm, every norm over d), `cfg.mlp` and
`cfg.d_ff` (GELU d -> d_ff -> d | SwiGLU), `cfg.qk_norm` (per-head RMSNorm of q and k before RoPE)
and width-muP (`cfg.mup_base_width`: hidden init std / sqrt(m), the attention scale, logits / m,
and the `mup_lr_scale` tags rgpt_dist.train.optim reads). Defaults are GPT-2's block, bitwise.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from rgpt_dist.models.block_options import (ffn_width, layer_norm, mark_hidden, mlp_kind, mup_hidden_std,
                                          mup_width_mult)
from rgpt_dist.models.kv_cache import LayerCache, new_positions

Parallel = Literal["column", "row", "none"]


class Linear(nn.Linear):
    """nn.Linear whose forward can take another weight of the same shape (a merged low-rank update:
    W + dW), as the tensor-parallel layers can."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, self.weight if weight is None else weight, self.bias)


class LayerFactory:
    """Creates the layers tensor parallelism must choose at construction (plain torch.nn here)."""

    tp_size: int = 1
    tp_rank: int = 0  # this rank's index in its tensor-parallel group: its heads are [rank x H_local, ...)

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

    loss_norm: str = "token"  # train.loss_norm: how cross_entropy and loss_weights reduce token losses

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Next-token loss in fp32 (fp64 for fp64 logits) over the real vocabulary (padding rows
        of the embedding never take probability mass); targets of -1 are ignored. Reduced as
        `loss_weights` says: loss_norm token = the mean over scored tokens (F.cross_entropy's own
        mean, unchanged bitwise), example = the RLT paper's per-example mean."""
        if self.loss_norm == "token":
            return F.cross_entropy(_real_vocab(logits, vocab_size), targets.flatten(), ignore_index=-1)
        return self.reduce_losses(self.token_losses(logits, targets, vocab_size), targets)

    def loss_weights(self, targets: torch.Tensor,
                     dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) targets -> (weights (B, T) in `dtype`, normaliser ()): a micro-batch's loss is
        (losses * weights).sum() / normaliser, for every objective that reduces token losses (the
        LM head here, Ouro's exits). token: weight 1 at each scored token (target != -1), normaliser
        their count. example (the RLT paper's normalisation): weight 1 / n_b at the n_b scored
        tokens of example b, normaliser the number of examples with n_b > 0, i.e. the mean over
        those examples of each one's mean token loss (all-padding rows count for nothing)."""
        valid = (targets >= 0).to(dtype)
        if self.loss_norm == "token":
            return valid, valid.sum()
        if self.loss_norm != "example":
            raise ValueError(f"loss_norm {self.loss_norm!r} must be 'token' or 'example'")
        scored = valid.sum(-1, keepdim=True)                                   # (B, 1): n_b
        return valid / scored.clamp(min=1), (scored > 0).sum().to(dtype)

    def reduce_losses(self, losses: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(..., B, T) token losses (0 where unscored) -> (...) losses reduced by `loss_weights`."""
        weights, n = self.loss_weights(targets, losses.dtype)
        return (losses * weights).sum((-2, -1)) / n

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


def residual_std(cfg: Any, block_executions: int) -> float:
    """GPT-2's scaled init of residual output projections: std / sqrt(2 * blocks executed)."""
    return cfg.init_std / math.sqrt(2 * block_executions)


POS_ENCODINGS = ("learned", "rope", "alibi", "none")  # as rgpt_dist.models.config (which imports no torch)


def pos_encoding(cfg: Any) -> str:
    """cfg.pos_encoding, `learned` for a config from before the field (an older export's config.json);
    an unknown value (a hand-edited config.json) is refused here as ModelConfig.problems does."""
    value = getattr(cfg, "pos_encoding", "learned")
    if value not in POS_ENCODINGS:
        raise ValueError(f"pos_encoding={value!r} is not one of {', '.join(POS_ENCODINGS)}")
    return value


def rope_base(cfg: Any) -> float:
    """cfg.rope_base for pos_encoding=rope, checked as ModelConfig.problems does (a hand-edited export
    config.json reaches the layers without it): finite, > 1, and an even head_dim."""
    base = getattr(cfg, "rope_base", 10000.0)
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 1:
        raise ValueError(f"rope_base={base!r} must be a finite number > 1")
    if cfg.head_dim % 2:
        raise ValueError(f"pos_encoding='rope' rotates pairs of features: head_dim={cfg.head_dim} must be even")
    return float(base)


def rope_rotate(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding, rotate-half form: x (B, H, T, hd) at positions pos (T,) or (B, T). Feature
    pair (j, j + hd/2) turns by angle pos x base^(-2j/hd); computed in >= fp32, returned in x's dtype."""
    hd, dtype = x.shape[-1], torch.promote_types(x.dtype, torch.float32)
    inv_freq = base ** (-torch.arange(0, hd, 2, device=x.device, dtype=dtype) / hd)  # (hd/2,)
    angle = pos.to(dtype)[..., None] * inv_freq                                     # (..., T, hd/2)
    angle = torch.cat([angle, angle], dim=-1)
    if angle.dim() == 3:                                                            # per-row positions
        angle = angle[:, None]                                                      # (B, 1, T, hd)
    xf = x.to(dtype)
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * angle.cos() + torch.cat([-x2, x1], dim=-1) * angle.sin()).to(x.dtype)


def alibi_slopes(n_head: int) -> list[float]:
    """ALiBi's head slopes (Press et al. 2022): 2^(-8/n) ... for a power of two n = 2^k heads
    (geometric, ratio = first = 2^(-8/n)); otherwise those of the largest power of two below n,
    then every other slope of twice that many for the rest (the paper's reference code)."""
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    if n_head & (n_head - 1) == 0:
        return geometric(n_head)
    low = 2 ** math.floor(math.log2(n_head))
    return geometric(low) + geometric(2 * low)[0::2][:n_head - low]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through SDPA (flash/memory-efficient kernels on GPU).

    The fused qkv projection's output features are laid out per head as [head, (q|k|v), head_dim]
    so that a column shard holds whole heads; `rgpt_dist.models.gpt2.from_hf_state_dict` converts
    from GPT-2's [(q|k|v), head, head_dim] layout. Positions (module doc): `rope` rotates q and k
    before the cache stores k; `alibi` attends under a float mask (the distance bias, -inf where a
    key is hidden), every other encoding keeps the boolean / is_causal paths.

    cfg.qk_norm: q and k are RMS-normalised per head over head_dim (one gain of head_dim features for
    q, one for k, shared by every head: replicated under tensor parallelism, its gradient summed over
    the ranks' heads by `factory.shared`) before RoPE. muP (mup_width_mult m): weights init with
    std / sqrt(m), and the logits q.k scale by sqrt(base_head_dim) / head_dim, base_head_dim =
    head_dim / m (1 / sqrt(head_dim) at m = 1, SDPA's default).
    """

    def __init__(self, cfg: Any, factory: LayerFactory, out_std: float):
        super().__init__()
        d = cfg.d_model
        self.head_dim = cfg.head_dim
        self.qkv = factory.linear(d, 3 * d, bias=cfg.bias, parallel="column", init_std=mup_hidden_std(cfg, cfg.init_std))
        self.proj = factory.linear(d, d, bias=cfg.bias, parallel="row", init_std=mup_hidden_std(cfg, out_std))
        mark_hidden(self, cfg)
        m = mup_width_mult(cfg)
        self.scale = None if m is None or m == 1 else math.sqrt(cfg.head_dim / m) / cfg.head_dim
        if getattr(cfg, "qk_norm", False):
            self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.ln_eps)
            self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.ln_eps)
            self.shared = factory.shared
        else:
            self.q_norm = self.k_norm = None
        self.pos_encoding = pos_encoding(cfg)
        self.rope_base = rope_base(cfg) if self.pos_encoding == "rope" else None
        local = cfg.n_head // factory.tp_size  # this rank's heads: a slice of the global slopes
        self.alibi_slopes = tuple(alibi_slopes(cfg.n_head)[factory.tp_rank * local:(factory.tp_rank + 1) * local])

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, delta: Deltas | None = None,
                mask: torch.Tensor | None = None, pos: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d), the new tokens. cache: their past's K/V (rgpt_dist.models.kv_cache), which
        `update` extends with theirs; None attends within x only. delta: low-rank updates added to
        the projections ('qkv', 'attn_proj'), or None. mask: (B, 1, T, P + T) boolean, True where
        a query may attend (padded batches, from `attention_mask`); None: causal. pos: the tokens'
        positions (B, T) for rope/alibi when x holds a subset of a sequence without a cache
        (Mixture-of-Recursions' gathered tokens); None: from the cache (`new_positions`)."""
        B, T, _ = x.shape
        qkv = _project(self.qkv, x, delta, "qkv").view(B, T, -1, 3, self.head_dim)  # (B, T, H_local, 3, hd)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)                # each (B, H_local, T, hd)
        if self.q_norm is not None:  # per head over hd, before RoPE (and before the cache keeps k)
            q = F.rms_norm(q, (self.head_dim,), self.shared(self.q_norm.weight), self.q_norm.eps)
            k = F.rms_norm(k, (self.head_dim,), self.shared(self.k_norm.weight), self.k_norm.eps)
        q_pos = None
        if self.pos_encoding in ("rope", "alibi"):
            q_pos = new_positions(cache, T, x.device) if pos is None else pos   # (T,) or (B, T)
        if self.pos_encoding == "rope":
            q, k = rope_rotate(q, q_pos, self.rope_base), rope_rotate(k, q_pos, self.rope_base)
        if cache is not None:
            k, v = cache.update(k, v)                                 # each (B, H_local, P + T, hd)
        past = k.shape[2] - T
        if self.pos_encoding == "alibi":
            k_pos = q_pos if pos is not None else torch.arange(k.shape[2], device=x.device)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self._alibi_bias(q_pos, k_pos, mask, q.dtype),
                                               scale=self.scale)
        elif mask is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        elif past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:  # query t sits at position past + t and sees keys 0..past + t (is_causal would align
            # top-left); a single new token sees every key, so it needs no mask (and keeps fast kernels)
            mask = None if T == 1 else \
                torch.arange(T, device=x.device)[:, None] + past >= torch.arange(past + T, device=x.device)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)  # (B, H_local, T, hd)
        return _project(self.proj, y.transpose(1, 2).reshape(B, T, -1), delta, "attn_proj")  # (B, T, d)

    def _alibi_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, mask: torch.Tensor | None,
                    dtype: torch.dtype) -> torch.Tensor:
        """The float attention mask: slope_h x (k_pos - q_pos) (<= 0) where the key is visible (causal,
        and `mask` if given), -inf elsewhere; (1 or B, H_local, T, K), in the logits' dtype."""
        acc = torch.promote_types(dtype, torch.float32)
        rel = (k_pos[..., None, :] - q_pos[..., :, None]).to(acc)     # (T, K) or (B, T, K)
        rel = rel[None] if rel.dim() == 2 else rel                     # (1 or B, T, K)
        slopes = torch.tensor(self.alibi_slopes, dtype=acc, device=rel.device)[None, :, None, None]
        visible = (rel <= 0)[:, None]                                  # (1 or B, 1, T, K)
        if mask is not None:
            visible = visible & mask
        return (slopes * rel[:, None]).masked_fill(~visible, float("-inf")).to(dtype)


class MLP(nn.Module):
    """d -> d_ff -> d (d_ff = ffn_width: 4d by default) with GPT-2's tanh-approximated GELU, or the exact
    x Phi(x) with approximate="none" (the RT family's gelu=exact)."""

    def __init__(self, cfg: Any, factory: LayerFactory, out_std: float, approximate: str = "tanh"):
        super().__init__()
        self.approximate = approximate
        d, f = cfg.d_model, ffn_width(cfg)
        self.fc = factory.linear(d, f, bias=cfg.bias, parallel="column", init_std=mup_hidden_std(cfg, cfg.init_std))
        self.proj = factory.linear(f, d, bias=cfg.bias, parallel="row", init_std=mup_hidden_std(cfg, out_std))
        mark_hidden(self, cfg)

    def forward(self, x: torch.Tensor, delta: Deltas | None = None) -> torch.Tensor:
        """delta: low-rank updates of 'fc' and 'mlp_proj', or None."""
        hidden = F.gelu(_project(self.fc, x, delta, "fc"), approximate=self.approximate)
        return _project(self.proj, hidden, delta, "mlp_proj")


class SwiGLU(nn.Module):
    """proj(silu(gate(x)) * fc(x)): gate and fc (the "up" map) d -> d_ff column-parallel, proj d_ff
    -> d row-parallel (Shazeer 2020); init as MLP, proj with the residual std."""

    def __init__(self, cfg: Any, factory: LayerFactory, out_std: float):
        super().__init__()
        d, f = cfg.d_model, ffn_width(cfg)
        std = mup_hidden_std(cfg, cfg.init_std)
        self.gate = factory.linear(d, f, bias=cfg.bias, parallel="column", init_std=std)
        self.fc = factory.linear(d, f, bias=cfg.bias, parallel="column", init_std=std)
        self.proj = factory.linear(f, d, bias=cfg.bias, parallel="row", init_std=mup_hidden_std(cfg, out_std))
        mark_hidden(self, cfg)

    def forward(self, x: torch.Tensor, delta: Deltas | None = None) -> torch.Tensor:
        """delta: low-rank updates of 'gate', 'fc' and 'mlp_proj', or None."""
        h = F.silu(_project(self.gate, x, delta, "gate")) * _project(self.fc, x, delta, "fc")  # (B, T, d_ff local)
        return _project(self.proj, h, delta, "mlp_proj")


class Block(nn.Module):
    """GPT-2 pre-norm block: x + attn(LN(x)), then x + mlp(LN(x)); LN is cfg.norm's (layer_norm),
    mlp cfg.mlp's (MLP or SwiGLU)."""

    def __init__(self, cfg: Any, factory: LayerFactory, out_std: float):
        super().__init__()
        self.ln_1 = layer_norm(cfg)
        self.attn = CausalSelfAttention(cfg, factory, out_std)
        self.ln_2 = layer_norm(cfg)
        mlp = SwiGLU if mlp_kind(cfg) == "swiglu" else MLP
        self.mlp = mlp(cfg, factory, out_std)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, delta: Deltas | None = None,
                mask: torch.Tensor | None = None, pos: torch.Tensor | None = None) -> torch.Tensor:
        """delta: per-projection low-rank updates (Relaxed Recursive Transformer's per-step LoRA);
        mask, pos: see CausalSelfAttention."""
        x = x + self.attn(self.ln_1(x), cache, delta, mask, pos)
        return x + self.mlp(self.ln_2(x), delta)


class Embeddings(nn.Module):
    """Token + learned position embeddings: (B, T) ids -> (B, T, d). With pos_encoding other than
    `learned` the token embedding only (no wpe: attention places the tokens, see the module doc)."""

    def __init__(self, cfg: Any, factory: LayerFactory):
        super().__init__()
        self.block_size = cfg.block_size
        self.wte = factory.embedding(cfg.padded_vocab_size, cfg.d_model, parallel="column", init_std=cfg.init_std)
        if pos_encoding(cfg) == "learned":  # (created after wte, as always: a seed gives the same weights)
            self.wpe = factory.embedding(cfg.block_size, cfg.d_model, parallel="none", init_std=cfg.init_std)
        else:
            self.wpe = None

    def forward(self, idx: torch.Tensor, start: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """idx: (B, T) tokens at positions start..start + T - 1 (start > 0 after cached tokens), or at
        `positions` (B, T) when given (padded batches count real tokens only)."""
        if self.wpe is None:
            return self.wte(idx)
        T = idx.shape[1]
        if start + T > self.block_size:
            raise ValueError(f"sequence length {start + T} exceeds block_size={self.block_size}: pos_encoding="
                             f"'learned' has no position past {self.block_size - 1} (rope, alibi and none have no limit)")
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
    """Final LayerNorm and the head tied to the token embedding; computes the loss when given targets.
    muP (mup_width_mult m != 1): the logits are multiplied by 1 / m (applied to the normed state)."""

    def __init__(self, cfg: Any, factory: LayerFactory, wte: nn.Module):
        super().__init__()
        self.ln_f = layer_norm(cfg)
        m = mup_width_mult(cfg)
        self.logit_scale = None if m is None or m == 1 else 1.0 / m
        self.factory = factory
        self.vocab_size = cfg.vocab_size
        self.wte = [wte]  # a list, so the tied weight is not registered (and counted) twice

    def tied_parameters(self) -> list[nn.Parameter]:
        """Parameters this module reads but another owns: the token embedding."""
        return [self.wte[0].weight]

    def forward(self, h: torch.Tensor, targets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.ln_f(h) if self.logit_scale is None else self.ln_f(h) * self.logit_scale
        logits = self.factory.lm_logits(h, self.wte[0].weight)  # (B, T, V_padded / tp)
        loss = None if targets is None else self.factory.cross_entropy(logits, targets, self.vocab_size)
        return logits, loss
