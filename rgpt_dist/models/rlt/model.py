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
Each decoder layer keeps the last W - 1 K/V it produced (its window ring), carried across chunks
with the state in a DecoderCarry (cache.py); positions are the token's index in the sequence from 0
(RoPE is relative, so the paper's origin 1 changes nothing). Chunks are anchored at position 0
wherever a forward starts, so training, prefill and token-by-token decoding on a cache
(`make_cache`; idx then holds the tokens after the cached ones) run the same schedule
(Proposition B.1). Truncated BPTT (cfg.tbptt = k) detaches the carry at positions k, 2k, ...

Initialisation (the shared layers' rules): N(0, init_std) weights, init_std / sqrt(2 (n_enc + n_dec))
for every residual output projection (encoder attention and FFN; decoder SWA, cross-attention and
FFN), zero biases (b_g included), s* ~ N(0, init_std^2) (RMSNorm_s removes its scale); under muP
every matrix but the embedding (memory K/V, cross q, W_g, W_s included) is a hidden one: std / sqrt(m)
and lr / m.

Plain PyTorch; every linear layer comes from the LayerFactory (tensor parallelism is declared
unsupported by the family spec for now; the layers already say how they would split: heads local,
the merge replicated). Activation checkpointing recomputes the encoder blocks (`checkpoint_units`).
ZeRO-3 gathers a module's parameters in that module's own hooks, so every parameter is read inside
the forward of the module that owns it: W_g = [W_ge | W_gs] is two Linears (Merge), the QK-norm
gains are HeadNorms, s* is read in Merge.forward (the tied head's embedding: the shared LMHead).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from rgpt_dist.models.block_options import layer_norm, mark_hidden, mlp_kind, mup_hidden_std, mup_width_mult
from rgpt_dist.models.layers import (MLP, Block, CausalSelfAttention, Embeddings, LayerFactory, LMHead, ModelOutput,
                                     SwiGLU, pos_encoding, residual_std, rope_base, rope_rotate)
from rgpt_dist.models.kv_cache import KVCache
from rgpt_dist.models.rlt.cache import DecoderCarry, visible
from rgpt_dist.models.rlt.config import RLTConfig

KV = tuple[torch.Tensor, torch.Tensor]
"""Keys and values, each (B, H_local, N, head_dim)."""


def _attention_scale(cfg: RLTConfig) -> float | None:
    """SDPA's scale as the shared layers set it: None (1 / sqrt(head_dim)) without muP or at m = 1,
    else sqrt(head_dim / m) / head_dim (rgpt_dist.models.layers.CausalSelfAttention)."""
    m = mup_width_mult(cfg)
    return None if m is None or m == 1 else math.sqrt(cfg.head_dim / m) / cfg.head_dim


class HeadNorm(nn.RMSNorm):
    """QK-norm: RMSNorm of each head's vector over head_dim, one gain for every head. The gain is read
    inside this module's forward, where ZeRO-3's per-module hooks gather it, and passes through
    `shared` (the factory's: under tensor parallelism its gradient is summed over the ranks' heads)."""

    def __init__(self, cfg: RLTConfig, shared: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__(cfg.head_dim, eps=cfg.ln_eps)
        self.shared = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, N, hd) -> (B, H, N, hd)."""
        return F.rms_norm(x, self.normalized_shape, self.shared(self.weight), self.eps)


def _head_norm(x: torch.Tensor, norm: HeadNorm | None) -> torch.Tensor:
    """QK-norm if the layer has it (cfg.qk_norm), else x."""
    return x if norm is None else norm(x)


class WindowSelfAttention(CausalSelfAttention):
    """The decoder's causal sliding-window self-attention (eq. 2.12-2.14): the shared attention's
    parameters (fused per-head qkv, QK-norm, RoPE, muP scale, output projection) with the projection
    and the attention exposed apart, so the layer can attend over its window cache + the chunk. Its
    QK-norm gains are HeadNorms (the same parameters, read inside their own forward)."""

    def __init__(self, cfg: RLTConfig, factory: LayerFactory, out_std: float):
        super().__init__(cfg, factory, out_std)
        if self.q_norm is not None:  # ones, as nn.RMSNorm's: no random draw; same names and order
            self.q_norm, self.k_norm = HeadNorm(cfg, factory.shared), HeadNorm(cfg, factory.shared)

    def heads(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, C, d), normed, at positions pos (C,) -> q, k, v, each (B, H_local, C, hd)."""
        B, C, _ = x.shape
        qkv = self.qkv(x).view(B, C, -1, 3, self.head_dim)            # (B, C, H_local, 3, hd)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)                 # each (B, H_local, C, hd)
        if self.q_norm is not None:
            q, k = _head_norm(q, self.q_norm), _head_norm(k, self.k_norm)
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
        self.q_norm = HeadNorm(cfg, factory.shared) if cfg.qk_norm else None
        self.rope_base = rope_base(cfg) if pos_encoding(cfg) == "rope" else None

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mem: KV, mask: torch.Tensor | None) -> torch.Tensor:
        """x (B, C, d), normed, at positions pos (C,); mem: keys/values (B, H_local, N, hd) of positions
        0..N-1; mask (C, N) or None (every key visible) -> (B, C, d)."""
        B, C, _ = x.shape
        q = self.q(x).view(B, C, -1, self.head_dim).transpose(1, 2)   # (B, H_local, C, hd)
        q = _head_norm(q, self.q_norm)
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
        self.k_norm = HeadNorm(cfg, factory.shared) if cfg.qk_norm else None
        self.rope_base = rope_base(cfg) if pos_encoding(cfg) == "rope" else None

    def forward(self, e: torch.Tensor, pos: torch.Tensor) -> KV:
        """e (B, T, d) encoder outputs at positions pos (T,) -> keys, values (B, H_local, T, hd)."""
        B, T, _ = e.shape
        kv = self.kv(self.norm(e)).view(B, T, -1, 2, self.head_dim)  # (B, T, H_local, 2, hd)
        k, v = kv.permute(3, 0, 2, 1, 4).unbind(0)                     # each (B, H_local, T, hd)
        k = _head_norm(k, self.k_norm)
        return (k if self.rope_base is None else rope_rotate(k, pos, self.rope_base)), v


class Merge(nn.Module):
    """The gated merge (eq. 2.9-2.11; RLT-2: 2.17-2.18) and the learned initial state s*:
    u_t = e_t + alpha sigmoid(W_g [e_t; r] + b_g) * W_s r, r = RMSNorm_s(s), with W_g = [W_ge | W_gs]
    (d x 2d) held as two Linears: `gate_e` (W_ge, b_g) runs over all positions at once (RLT.decode),
    `gate_s` (W_gs) on r once per chunk. Every parameter is read inside its own module's forward (s*
    in this one's), where ZeRO-3's per-module hooks gather it. Replicated under tensor parallelism
    (parallel='none')."""

    def __init__(self, cfg: RLTConfig, factory: LayerFactory):
        super().__init__()
        d, std = cfg.d_model, mup_hidden_std(cfg, cfg.init_std)
        self.d, self.alpha = d, cfg.alpha
        self.norm = layer_norm(cfg)                                    # RMSNorm_s
        with torch.random.fork_rng(devices=[]):  # their own draws are discarded: W_g is drawn below
            self.gate_e = factory.linear(d, d, bias=True, parallel="none", init_std=std)   # W_ge, b_g
            self.gate_s = factory.linear(d, d, bias=False, parallel="none", init_std=std)  # W_gs
        whole = factory.linear(2 * d, d, bias=True, parallel="none", init_std=std)  # W_g, b_g: N(0, std), 0
        with torch.no_grad():  # drawn whole as before the split: the same initial weights, bitwise
            self.gate_e.weight.copy_(whole.weight[:, :d])
            self.gate_e.bias.copy_(whole.bias)
            self.gate_s.weight.copy_(whole.weight[:, d:])
        self.proj = factory.linear(d, d, bias=False, parallel="none", init_std=std)     # W_s
        mark_hidden(self, cfg)
        self.s0 = nn.Parameter(torch.empty(d).normal_(0.0, cfg.init_std))  # s*: scale-free after RMSNorm_s
        self.register_load_state_dict_pre_hook(_split_gate)

    def initial(self, batch: int) -> torch.Tensor:
        """h_0 = s* for every row: (B, d) (through forward, so that s* is read inside it)."""
        return self(rows=batch)

    def forward(self, e: torch.Tensor | None = None, gate_e: torch.Tensor | None = None,
                state: torch.Tensor | None = None, rows: int | None = None) -> torch.Tensor:
        """e (B, C, d) of the chunk's positions, gate_e = gate_e(e) (B, C, d), state (B, d) -> z^0
        (B, C, d); or, given only rows = B, h_0 = s* for every row (B, d)."""
        if rows is not None:  # a copy: expand's view has no grad_fn under no_grad (the flop counter refuses it)
            return self.s0.repeat(rows, 1)
        r = self.norm(state)                                           # (B, d): RMSNorm_s(h_{k-1})
        g = torch.sigmoid(gate_e + self.gate_s(r)[:, None])           # (B, C, d)
        return e + self.alpha * g * self.proj(r)[:, None]              # (B, C, d)


def _split_gate(module: Merge, state_dict: dict, prefix: str, *_: Any) -> None:
    """Loads a state dict written before W_g was split (one Linear `gate`: weight (d, 2d), bias (d,)):
    its halves and b_g become gate_e's and gate_s's, so older checkpoints and exports load unchanged.
    A weight of another shape is left to load_state_dict's size check (split at d, it cannot fit)."""
    weight, bias = state_dict.pop(prefix + "gate.weight", None), state_dict.pop(prefix + "gate.bias", None)
    if weight is not None:
        state_dict[prefix + "gate_e.weight"] = weight[:, :module.d].contiguous()
        state_dict[prefix + "gate_s.weight"] = weight[:, module.d:].contiguous()
    if bias is not None:
        state_dict[prefix + "gate_e.bias"] = bias


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

    def forward(self, z: torch.Tensor, pos: torch.Tensor, ring: KV, mask: torch.Tensor | None, mem: KV,
                cmask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """z (B, C, d): a chunk at positions pos (C,); ring: this layer's window ring (B, H_local,
        W - 1, hd) each; mask (C, W - 1 + C) over [ring, chunk] (None: every key visible); mem: the
        memory (B, H_local, N, hd) of positions 0..N-1 with cmask (C, N) (None: all visible).
        -> (z' (B, C, d), the chunk's k, v (B, H_local, C, hd) for the ring). A pure function (no
        state: activation checkpointing may recompute it)."""
        q, k, v = self.attn.heads(self.ln_1(z), pos)                   # each (B, H_local, C, hd)
        keys, values = torch.cat([ring[0], k], 2), torch.cat([ring[1], v], 2)  # (B, H_local, W - 1 + C, hd)
        b = z + self.attn.out(F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.attn.scale))
        a = b + self.cross(self.ln_2(b), pos, mem, cmask)             # (B, C, d)
        return a + self.mlp(self.ln_3(a)), k, v


class RLT(nn.Module):
    """The Recurrent Looped Transformer: RLT-1 (feedback_interval 1), RLT-2 (B > 1), RLT-0 (0)."""

    may_have_unused_params = False  # every parameter receives a gradient every step

    def checkpoint_units(self, mode: str) -> list[nn.Module]:
        """Modules whose activations are recomputed in backward (rgpt_dist.parallel.checkpointing), in
        every mode: the encoder blocks. The decoder layers are pure functions too (their rings pass in
        and out), but the per-chunk loop keeps them out for now (spec.recompute_flops counts the encoder)."""
        return list(self.encoder)

    def __init__(self, cfg: RLTConfig, factory: LayerFactory | None = None):
        super().__init__()
        if pos_encoding(cfg) == "alibi":
            raise ValueError("pos_encoding='alibi' is not supported by RLT: its window and memory attention "
                             "have no ALiBi bias (use rope, learned or none)")
        factory = factory or LayerFactory()
        self.cfg, self.local_heads = cfg, cfg.n_head // factory.tp_size  # heads of this rank's shard
        out_std = residual_std(cfg, cfg.n_enc + cfg.n_dec)  # the per-token stack depth, as a Transformer's
        self.embed = Embeddings(cfg, factory)
        self.encoder = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_enc))
        # the memory exists only for decoder layers to read (the 8 + 0 split has none)
        self.memory = nn.ModuleList(Memory(cfg, factory) for _ in range(cfg.mem_groups if cfg.n_dec else 0))
        self.merge = Merge(cfg, factory) if cfg.feedback_interval > 0 else None
        self.decoder = nn.ModuleList(DecoderLayer(cfg, factory, out_std) for _ in range(cfg.n_dec))
        self.head = LMHead(cfg, factory, self.embed.wte)

    def make_cache(self, strategy: str = "full", r: int | None = None, max_len: int | None = None,
                   fixed: bool = False, store: Callable[[], Any] | None = None) -> KVCache:
        """An empty cache for `forward(..., cache=)` (layout: rgpt_dist.models.rlt.cache): one K/V store
        per encoder block, then one per memory group, static with max_len tokens (default block_size)
        or dynamic with `store` (the Hugging Face export's); fixed: for fixed-shape (compiled)
        decoding. The window rings and the state are made by the first forward (`KVCache.carry`). No
        block is shared across depth, so every known strategy gives this cache; r must be None."""
        if r is not None:
            raise ValueError("RLT has no recurrence depth: r is not supported")
        n, block_size = self.cfg.n_enc + len(self.memory), self.cfg.block_size
        if store is not None:
            return KVCache(n, strategy=strategy, block_size=block_size, store=store)
        return KVCache(n, strategy=strategy, block_size=block_size,
                       max_len=block_size if max_len is None else max_len, fixed=fixed)

    def encode(self, idx: torch.Tensor, stores: list | None = None, past: int = 0,
               mask: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids -> e (B, T, d): the causal encoder, all positions at once (eq. 2.1). With a
        cache: the n_enc blocks' K/V stores holding `past` earlier tokens, which the new ones attend
        to; mask (1, 1, T, max_len) and positions (B, T) in a fixed-shape step."""
        e = self.embed(idx, past, positions)                           # (B, T, d)
        for block, store in zip(self.encoder, stores or [None] * len(self.encoder)):
            e = block(e, store, None, mask)
        return e

    def decode(self, e: torch.Tensor, pos: torch.Tensor | None = None, mems: list[KV] | None = None,
               carry: DecoderCarry | None = None, start: int = 0, fixed: bool = False) -> torch.Tensor:
        """e (B, T, d) at positions pos (T,) = start..start+T-1 -> y (B, T, d): the decoder chunk by
        chunk, chunks anchored at position 0 (length 1 for RLT-1, B for RLT-2, the whole input for
        RLT-0), the state advancing only at a complete chunk. mems: each memory group's K/V of
        positions 0..N-1, N >= start + T (default: built from e). carry: a cache's rings and state
        (default: a fresh one, training: detached every cfg.tbptt positions). fixed: pos is a
        fixed-shape step's slot index (one token; `start` is not read)."""
        B, T, _ = e.shape
        pos = torch.arange(T, device=e.device) if pos is None else pos  # (T,)
        mems = [m(e, pos) for m in self.memory] if mems is None else mems  # G x KV (B, H_local, N, hd)
        cached, C, k = carry is not None, self.cfg.feedback_interval, self.cfg.tbptt
        carry = carry or DecoderCarry(len(self.decoder), self.cfg.window, inplace=False)
        carry.start(None if self.merge is None else self.merge.initial(B),
                    e, (B, self.local_heads, self.cfg.window - 1, self.cfg.head_dim))  # a ring's shape
        gate_e = None if self.merge is None else self.merge.gate_e(e)  # (B, T, d)
        ys, s = [], 0
        while s < T:
            p0 = start + s                                             # the piece's first position
            c = 1 if fixed else (min(T - s, C - p0 % C) if C else T - s)  # up to the next chunk boundary
            if k and not cached and p0 and p0 % k == 0:
                carry.detach()                                         # truncated BPTT (paper H.1)
            g = None if gate_e is None else gate_e[:, s:s + c]
            ys.append(self._chunk(e[:, s:s + c], g, pos[s:s + c], p0, mems, carry, fixed))
            s += c
        return torch.cat(ys, 1)                                        # (B, T, d)

    def _chunk(self, z: torch.Tensor, gate_e: torch.Tensor | None, pos: torch.Tensor, p0: int, mems: list[KV],
               carry: DecoderCarry, fixed: bool) -> torch.Tensor:
        """One chunk (or a partial one) z, gate_e (B, c, d) at positions pos (c,) = p0.. -> y (B, c, d):
        the merge with the register, every decoder layer, then the rings and the register advance."""
        c, W = z.shape[1], self.cfg.window
        if self.merge is not None:
            z = self.merge(z, gate_e, carry.state)                     # (B, c, d): z^0
        # one query with a full ring sees every key: no mask (fast kernels)
        mask = None if c == 1 and not fixed and p0 >= W - 1 else carry.window_mask(pos, W)  # (c, W - 1 + c)
        if fixed:  # whole static buffers: hide the positions after the token
            cmask = None if not mems else torch.arange(mems[0][0].shape[2], device=z.device) <= pos[:, None]
            views = mems
        else:      # the memory of positions <= the chunk's last: j <= t
            views = [(mk[:, :, :p0 + c], mv[:, :, :p0 + c]) for mk, mv in mems]
            cmask = None if c == 1 else visible(pos, torch.arange(p0 + c, device=z.device), None)  # (c, p0 + c)
        ring, G, L = carry.slots(pos), len(mems), len(self.decoder)
        for i, layer in enumerate(self.decoder):
            z, k, v = layer(z, pos, (carry.keys[i], carry.values[i]), mask, views[i * G // L], cmask)
            carry.write(i, k, v, *ring)
        carry.advance(pos, *ring)
        if self.merge is not None:  # h_k = y at a complete chunk's end
            C = self.cfg.feedback_interval
            carry.feed_back(z[:, -1], (pos[-1] + 1) % C == 0 if fixed else (p0 + c) % C == 0)
        return z

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, r: int | None = None,
                all_exits: bool = False, noise_key: object = None, cache: KVCache | None = None,
                stats: bool = False, mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> ModelOutput:
        """idx, targets: (B, T) token ids (targets -1: unscored). `r`, `all_exits`, `noise_key` and
        `stats` exist for a uniform interface across families (no depth, noise or statistics here).
        cache: from `make_cache`, holding the tokens before idx (inference only). mask, positions:
        only in a fixed-shape decode step (rgpt_dist.models.generate), where RLT takes both from the
        cache's slot index; padded batches are not supported (the state would run through padding)."""
        if r is not None or all_exits:
            raise ValueError("RLT has no recurrence depth: r and all_exits are not supported")
        fixed = cache is not None and cache.slots is not None and cache.slots.index is not None
        if (mask is not None or positions is not None) and not fixed:
            raise ValueError("RLT does not support padded batches (mask, positions): its recurrent state would "
                             "run through the padding")
        y = self.decode(self.encode(idx)) if cache is None else self._cached(idx, cache, fixed)  # (B, T, d)
        logits, loss = self.head(y, targets)                           # (B, T, V), ()
        return ModelOutput(loss=loss, logits=logits)

    def _cached(self, idx: torch.Tensor, cache: KVCache, fixed: bool) -> torch.Tensor:
        """idx (B, T): the tokens after the cache's -> y (B, T, d); the cache then holds them too."""
        T = idx.shape[1]
        past = cache.begin(T, None, self.training)
        if fixed and T != 1:
            raise ValueError(f"a fixed-shape RLT decode step feeds one token, got {T}")
        if cache.carry is None:
            if past:
                raise ValueError(f"this cache holds {past} tokens but no RLT carry (not filled by RLT.forward)")
            cache.carry = DecoderCarry(len(self.decoder), self.cfg.window, inplace=True)
        pos = cache.slots.index if fixed else torch.arange(past, past + T, device=idx.device)  # (T,)
        n, emask, positions = self.cfg.n_enc, None, None
        if fixed:  # the encoder's static buffers are read whole: (1, 1, 1, max_len)
            emask = (torch.arange(cache.max_len, device=idx.device) <= pos[:, None])[None, None]
            positions = pos.expand(idx.shape[0], -1)                   # (B, 1)
        e = self.encode(idx, cache.layers[:n], past, emask, positions)  # (B, T, d)
        mems = [store.update(*m(e, pos)) for m, store in zip(self.memory, cache.layers[n:])]  # G x (B, H, N, hd)
        y = self.decode(e, pos, mems, cache.carry, past, fixed)
        cache.end(T)
        return y
