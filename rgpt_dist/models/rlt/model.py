"""The Recurrent Looped Transformer (paper section 2, equations 2.1-2.19): RLT-1, RLT-2 and RLT-0.

    idx (B, T) -> wte -> n_enc causal Blocks -> e (B, T, d)                      (2.1)
    memory, per group g: k_t = RoPE_t(knorm(W_K RMSNorm_E(e_t))), v_t = W_V RMSNorm_E(e_t)   (2.2)
    chunk k = positions [(k-1)C, kC) (C = B; 1 for RLT-1; T for RLT-0), state h_0 = s*:
        z^0_t = e_t + alpha sigmoid(W_g [e_t; RMSNorm_s(h_{k-1})] + b_g) * W_s RMSNorm_s(h_{k-1})
                (RLT-0: z^0_t = e_t, no merge parameters)                        (2.9-2.11, 2.17-2.18)
        each decoder layer l, positions of the chunk together:                   (2.12-2.16)
            b = z + SWA(RMSNorm(z)) over the layer's own K/V at max(0, t - W + 1) .. t
            a = b + CrossAttn(RMSNorm(b)) over memory g(l) at positions <= t
            z = a + FFN(RMSNorm(a))
        y_t = z^{n_dec}_t;  h_k = y at the chunk's last position if the chunk is complete  (2.19)
    logits = tied head(RMSNorm_o(y)) (B, T, V)                                   (2.6)

RLT-1 is the chunk schedule at C = 1 (one code path: RLT-2 with B = 1 is RLT-1 by construction), so
its decoder runs token by token and each token reads the state of the previous token's last layer.
Each decoder layer keeps the last W - 1 K/V it produced (its window cache), carried across chunks;
positions are the token's index in the sequence from 0 (RoPE is relative, so the paper's origin 1
changes nothing).

Initialisation (the shared layers' rules): N(0, init_std) weights, init_std / sqrt(2 (n_enc + n_dec))
for every residual output projection (encoder attention and FFN; decoder SWA, cross-attention and
FFN), zero biases (b_g included), s* ~ N(0, init_std^2) (RMSNorm_s removes its scale); under muP
every matrix but the embedding (memory K/V, cross q, W_g, W_s included) is a hidden one: std / sqrt(m)
and lr / m.

Plain PyTorch; every linear layer comes from the LayerFactory (tensor parallelism
is injected there later: heads are local, the merge replicated).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from rgpt_dist.models.block_options import layer_norm, mark_hidden, mlp_kind, mup_hidden_std, mup_width_mult
from rgpt_dist.models.layers import (MLP, Block, CausalSelfAttention, Embeddings, LayerFactory, LMHead, ModelOutput,
                                     SwiGLU, pos_encoding, residual_std, rope_base, rope_rotate)
from rgpt_dist.models.rlt.config import RLTConfig

KV = tuple[torch.Tensor, torch.Tensor]
"""Keys and values, each (B, H_local, N, head_dim)."""


def _attention_scale(cfg: RLTConfig) -> float | None:
    """SDPA's scale as the shared layers set it: None (1 / sqrt(head_dim)) without muP or at m = 1,
    else sqrt(head_dim / m) / head_dim (rgpt_dist.models.layers.CausalSelfAttention)."""
    m = mup_width_mult(cfg)
    return None if m is None or m == 1 else math.sqrt(cfg.head_dim / m) / cfg.head_dim


def _head_norm(x: torch.Tensor, norm: nn.RMSNorm | None, shared) -> torch.Tensor:
    """QK-norm: RMSNorm of each head's vector over head_dim (x (B, H, N, hd)); identity without it."""
    return x if norm is None else F.rms_norm(x, (x.shape[-1],), shared(norm.weight), norm.eps)


def _visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """(C,) query and (N,) key positions -> (C, N) boolean, True where the key is visible: causal
    (k <= q) and, with a window, within it (q - k < window)."""
    vis = k_pos[None, :] <= q_pos[:, None]                            # (C, N)
    return vis if window is None else vis & (k_pos[None, :] > q_pos[:, None] - window)


class WindowSelfAttention(CausalSelfAttention):
    """The decoder's causal sliding-window self-attention (eq. 2.12-2.14): the shared attention's
    parameters (fused per-head qkv, QK-norm, RoPE, muP scale, output projection) with the projection
    and the attention exposed apart, so the layer can attend over its window cache + the chunk."""

    def heads(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, C, d), normed, at positions pos (C,) -> q, k, v, each (B, H_local, C, hd)."""
        B, C, _ = x.shape
        qkv = self.qkv(x).view(B, C, -1, 3, self.head_dim)            # (B, C, H_local, 3, hd)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)                 # each (B, H_local, C, hd)
        if self.q_norm is not None:
            q, k = _head_norm(q, self.q_norm, self.shared), _head_norm(k, self.k_norm, self.shared)
        if self.rope_base is not None:
            q, k = rope_rotate(q, pos, self.rope_base), rope_rotate(k, pos, self.rope_base)
        return q, k, v

    def out(self, y: torch.Tensor) -> torch.Tensor:
        """(B, H_local, C, hd) attention output -> (B, C, d) through the output projection."""
        return self.proj(y.transpose(1, 2).flatten(2))

    def forward(self, *args, **kwargs):
        """Refused: the inherited full-causal forward would ignore the window (DecoderLayer calls
        `heads` and `out` around its own windowed attention)."""
        raise NotImplementedError("WindowSelfAttention runs through DecoderLayer (heads, then out)")


class CrossAttention(nn.Module):
    """Encoder-memory cross-attention (eq. 2.15): q = RoPE_t(qnorm(W_Q x)) per head, keys and values
    the memory's (already normed and rotated), the output projection; heads as the memory's."""

    def __init__(self, cfg: RLTConfig, factory: LayerFactory, out_std: float):
        super().__init__()
        d = cfg.d_model
        self.head_dim, self.scale = cfg.head_dim, _attention_scale(cfg)
        self.q = factory.linear(d, d, bias=cfg.bias, parallel="column", init_std=mup_hidden_std(cfg, cfg.init_std))
        self.proj = factory.linear(d, d, bias=cfg.bias, parallel="row", init_std=mup_hidden_std(cfg, out_std))
        mark_hidden(self, cfg)
        self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.ln_eps) if cfg.qk_norm else None
        self.shared = factory.shared
        self.rope_base = rope_base(cfg) if pos_encoding(cfg) == "rope" else None

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mem: KV, mask: torch.Tensor | None) -> torch.Tensor:
        """x (B, C, d), normed, at positions pos (C,); mem: keys/values (B, H_local, N, hd) of positions
        0..N-1; mask (C, N) or None (every key visible) -> (B, C, d)."""
        B, C, _ = x.shape
        q = self.q(x).view(B, C, -1, self.head_dim).transpose(1, 2)   # (B, H_local, C, hd)
        q = _head_norm(q, self.q_norm, self.shared)
        if self.rope_base is not None:
            q = rope_rotate(q, pos, self.rope_base)
        y = F.scaled_dot_product_attention(q, mem[0], mem[1], attn_mask=mask, scale=self.scale)  # (B, H_local, C, hd)
        return self.proj(y.transpose(1, 2).flatten(2))                # (B, C, d)


class Memory(nn.Module):
    """One memory group (eq. 2.2): k_t = RoPE_t(knorm(W_K RMSNorm_E(e_t))), v_t = W_V RMSNorm_E(e_t),
    one norm shared by both maps; W_K and W_V fused, laid out per head [head, (k|v), hd] so that a
    column shard holds whole heads."""

    def __init__(self, cfg: RLTConfig, factory: LayerFactory):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.norm = layer_norm(cfg)
        self.kv = factory.linear(cfg.d_model, 2 * cfg.d_model, bias=cfg.bias, parallel="column",
                                 init_std=mup_hidden_std(cfg, cfg.init_std))
        mark_hidden(self, cfg)
        self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.ln_eps) if cfg.qk_norm else None
        self.shared = factory.shared
        self.rope_base = rope_base(cfg) if pos_encoding(cfg) == "rope" else None

    def forward(self, e: torch.Tensor, pos: torch.Tensor) -> KV:
        """e (B, T, d) encoder outputs at positions pos (T,) -> keys, values (B, H_local, T, hd)."""
        B, T, _ = e.shape
        kv = self.kv(self.norm(e)).view(B, T, -1, 2, self.head_dim)  # (B, T, H_local, 2, hd)
        k, v = kv.permute(3, 0, 2, 1, 4).unbind(0)                     # each (B, H_local, T, hd)
        k = _head_norm(k, self.k_norm, self.shared)
        return (k if self.rope_base is None else rope_rotate(k, pos, self.rope_base)), v


class Merge(nn.Module):
    """The gated merge (eq. 2.9-2.11; RLT-2: 2.17-2.18) and the learned initial state s*:
    u_t = e_t + alpha sigmoid(W_g [e_t; r] + b_g) * W_s r, r = RMSNorm_s(s). W_g (d x 2d, with b_g)
    is applied as its e-half over all positions at once plus its r-half once per chunk. Replicated
    under tensor parallelism (parallel='none')."""

    def __init__(self, cfg: RLTConfig, factory: LayerFactory):
        super().__init__()
        d, std = cfg.d_model, mup_hidden_std(cfg, cfg.init_std)
        self.d, self.alpha = d, cfg.alpha
        self.norm = layer_norm(cfg)                                    # RMSNorm_s
        self.gate = factory.linear(2 * d, d, bias=True, parallel="none", init_std=std)  # W_g, b_g
        self.proj = factory.linear(d, d, bias=False, parallel="none", init_std=std)     # W_s
        mark_hidden(self, cfg)
        self.s0 = nn.Parameter(torch.empty(d).normal_(0.0, cfg.init_std))  # s*: scale-free after RMSNorm_s

    def initial(self, batch: int) -> torch.Tensor:
        """h_0 = s* for every row: (B, d)."""
        return self.s0.expand(batch, -1)

    def gate_e(self, e: torch.Tensor) -> torch.Tensor:
        """The gate's token part W_g[:, :d] e_t + b_g for every position: (B, T, d) -> (B, T, d)."""
        return F.linear(e, self.gate.weight[:, :self.d], self.gate.bias)

    def forward(self, e: torch.Tensor, gate_e: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """e, gate_e (B, C, d) of the chunk's positions, state (B, d) -> z^0 (B, C, d)."""
        r = self.norm(state)                                           # (B, d): RMSNorm_s(h_{k-1})
        g = torch.sigmoid(gate_e + F.linear(r, self.gate.weight[:, self.d:])[:, None])  # (B, C, d)
        return e + self.alpha * g * self.proj(r)[:, None]              # (B, C, d)


class DecoderLayer(nn.Module):
    """One decoder layer (eq. 2.12-2.16): window self-attention, memory cross-attention, FFN, each
    pre-normed (cfg.norm) with a residual."""

    def __init__(self, cfg: RLTConfig, factory: LayerFactory, out_std: float):
        super().__init__()
        self.window = cfg.window
        self.ln_1 = layer_norm(cfg)
        self.attn = WindowSelfAttention(cfg, factory, out_std)
        self.ln_2 = layer_norm(cfg)
        self.cross = CrossAttention(cfg, factory, out_std)
        self.ln_3 = layer_norm(cfg)
        self.mlp = (SwiGLU if mlp_kind(cfg) == "swiglu" else MLP)(cfg, factory, out_std)

    def forward(self, z: torch.Tensor, start: int, pos: torch.Tensor, past: KV | None,
                mem: KV) -> tuple[torch.Tensor, KV]:
        """z (B, C, d): the chunk at positions pos = start..start+C-1 (C,); past: this layer's last
        <= W-1 K/V before start (None at the sequence start); mem: the memory of all T positions.
        -> (z' (B, C, d), the window cache after the chunk: its last <= W-1 K/V)."""
        C = z.shape[1]
        q, k, v = self.attn.heads(self.ln_1(z), pos)                   # each (B, H_local, C, hd)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)  # (B, H_local, P + C, hd)
        # a single token sees its whole cache (<= W-1 entries) and itself: no mask (fast kernels)
        mask = None if C == 1 else _visible(pos, torch.arange(start + C - k.shape[2], start + C, device=z.device),
                                            self.window)               # (C, P + C)
        b = z + self.attn.out(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.attn.scale))
        keep = max(0, k.shape[2] - (self.window - 1))                  # retain the last W - 1 (none at W = 1)
        mk, mv = mem[0][:, :, :start + C], mem[1][:, :, :start + C]    # (B, H_local, start + C, hd): j <= t
        cmask = None if C == 1 else _visible(pos, torch.arange(start + C, device=z.device), None)  # (C, start + C)
        a = b + self.cross(self.ln_2(b), pos, (mk, mv), cmask)        # (B, C, d)
        return a + self.mlp(self.ln_3(a)), (k[:, :, keep:], v[:, :, keep:])


class RLT(nn.Module):
    """The Recurrent Looped Transformer: RLT-1 (feedback_interval 1), RLT-2 (B > 1), RLT-0 (0)."""

    may_have_unused_params = False  # every parameter receives a gradient every step

    def __init__(self, cfg: RLTConfig, factory: LayerFactory | None = None):
        super().__init__()
        if pos_encoding(cfg) == "alibi":
            raise ValueError("pos_encoding='alibi' is not supported by RLT: its window and memory attention "
                             "have no ALiBi bias (use rope, learned or none)")
        factory = factory or LayerFactory()
        self.cfg = cfg
        out_std = residual_std(cfg, cfg.n_enc + cfg.n_dec)  # the per-token stack depth, as a Transformer's
        self.embed = Embeddings(cfg, factory)
        self.encoder = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_enc))
        # the memory exists only for decoder layers to read (the 8 + 0 split has none)
        self.memory = nn.ModuleList(Memory(cfg, factory) for _ in range(cfg.mem_groups if cfg.n_dec else 0))
        self.merge = Merge(cfg, factory) if cfg.feedback_interval > 0 else None
        self.decoder = nn.ModuleList(DecoderLayer(cfg, factory, out_std) for _ in range(cfg.n_dec))
        self.head = LMHead(cfg, factory, self.embed.wte)

    def encode(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> e (B, T, d): the causal encoder, all positions at once (eq. 2.1)."""
        e = self.embed(idx)                                            # (B, T, d)
        for block in self.encoder:
            e = block(e)
        return e

    def decode(self, e: torch.Tensor) -> torch.Tensor:
        """e (B, T, d) -> y (B, T, d): memory, then the decoder chunk by chunk (chunk length 1 for
        RLT-1, B for RLT-2, T for RLT-0), the state advancing only at a complete chunk."""
        B, T, _ = e.shape
        pos = torch.arange(T, device=e.device)                         # (T,)
        mems = [m(e, pos) for m in self.memory]                        # G x KV (B, H_local, T, hd)
        C = self.cfg.feedback_interval or T
        state = None if self.merge is None else self.merge.initial(B)  # (B, d): h_0 = s*
        gate_e = None if self.merge is None else self.merge.gate_e(e)  # (B, T, d)
        G, L = len(self.memory), len(self.decoder)
        past: list[KV | None] = [None] * L
        ys = []
        for start in range(0, T, C):
            z = e[:, start:start + C]                                  # (B, c, d), c = C or the rest
            c = z.shape[1]
            if self.merge is not None:
                z = self.merge(z, gate_e[:, start:start + c], state)   # (B, c, d): z^0
            for i, layer in enumerate(self.decoder):
                z, past[i] = layer(z, start, pos[start:start + c], past[i], mems[i * G // L])
            ys.append(z)
            if self.merge is not None and c == C:
                state = z[:, -1]                                       # (B, d): h_k = y at the chunk's end
        return torch.cat(ys, 1)                                        # (B, T, d)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, r: int | None = None,
                all_exits: bool = False, noise_key: object = None, cache: object = None,
                stats: bool = False, mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> ModelOutput:
        """idx, targets: (B, T) token ids (targets -1: unscored). `r`, `all_exits`, `noise_key` and
        `stats` exist for a uniform interface across families (no depth, noise or statistics here);
        a KV cache and padded batches (`cache`, `mask`, `positions`) are not supported yet."""
        if r is not None or all_exits:
            raise ValueError("RLT has no recurrence depth: r and all_exits are not supported")
        if cache is not None or mask is not None or positions is not None:
            raise ValueError("RLT does not support a KV cache or padded batches (cache, mask, positions) yet")
        y = self.decode(self.encode(idx))                              # (B, T, d)
        logits, loss = self.head(y, targets)                           # (B, T, V), ()
        return ModelOutput(loss=loss, logits=logits)
