"""The layerwise Recurrent Transformer (SPEC section 9): each layer attends to key/value pairs made
from its OWN outputs at earlier positions. Per layer, L = n_layer, RMS = the layer's norm (ln_1 or
ln_2, a learned gain), RMS_h = the per-head QK-norm:

    xn = RMS_1(x);  q = RMS_h(Q xn);  k~ = RMS_h(K xn);  v~ = V xn          (temporary pairs: all positions at once)
    a_t = O Attn(q_t; persistent pairs of positions < t, plus the temporary pair of t)    (rt.tiled.scan)
    z_t = x_t + (a_t + MLP(RMS_2(x_t + a_t / sqrt(L)))) / sqrt(L)
    k_t = RMS_h(K RMS_1(z_t)),  v_t = V RMS_1(z_t)                           (position t's persistent pair)

and z is the next layer's input. Readings of the SPEC's equations:
- a_i includes the output projection O (the attention block's output, as in the authors' OLMo block,
  whose attention returns attn_out(att)); the residual and the MLP read O-projected values.
- The persistent pair is the layer's key/value map kv(y) = (RMS_h(K RMS_1 y), V RMS_1 y) applied to
  z_t, the same map that makes the temporary pair from x_t: the same K, V ("the same K and V"), the
  same input norm RMS_1 and key norm RMS_h. So a layer has exactly a Transformer block's parameters
  and its persistent pair is what a Transformer layer fed z_t would cache.
- ALiBi: slope_h x distance, the temporary pair at distance 0 (it belongs to position t). RoPE
  (not the authors'): q and the temporary and persistent keys of position t rotated at t.
- The MLP is the shared layers' (GPT-2's tanh-approximated GELU; the authors' OLMo uses the exact one).
- Initialisation as the shared layers, N(0, init_std) for every matrix (the output projections too:
  the 1/sqrt(L) branch scaling already plays the part of GPT-2's 1/sqrt(2 L) init scaling).

Options (RTConfig; these readings are the defaults) toward the authors' released block
(geniucos/recurrent-transformer, olmo/model.py; the `rt-authors-*` flavours set them all):
residual_scale=none: z_t = h_t + MLP(N_2(h_t)), h_t = x_t + a_t (no 1/sqrt(L)); norm=layernorm with
bias=false: N is LayerNorm with a gain and no bias; qk_norm_type=layernorm and qk_norm_span=width:
QK-norm is that LayerNorm over all d features of q and of k (a gain of d), not per head;
init_scheme=authors: OLMo's truncated `mitchell` init (`authors_init`); gelu=exact; alibi_slopes=geometric:
2^(-8h/H) for every H.

Three forwards compute the same function: the per-position oracle (cfg.prefill = naive:
rt.tiled.naive_scan), the exact tiled prefill (cfg.prefill = tiled, the training path: rt.tiled.scan)
and cached decoding (make_cache; forward(idx, cache=) on a prompt chunk, then on further tokens or
chunks). The cache holds each layer's persistent K/V, n_layer x 2 x T x d numbers: a Transformer's.
An empty cache's first chunk runs the prefill scan and stores its persistent pairs; later tokens run
one position at a time (`RTLayer.decode`: one query over the cached pairs and its own temporary
pair; with a fixed-shape cache, the compiled decode step of rgpt_dist.models.generate, over the whole
buffers with the slots from the new position on masked). Plain PyTorch, no process groups; the linear layers come from the LayerFactory with their
tensor-parallel splits (q, kv column, O row, heads whole per shard), as the shared layers'.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from rgpt_dist.models.block_options import ffn_width, layer_norm, mlp_kind
from rgpt_dist.models.kv_cache import KVCache
from rgpt_dist.models.layers import (MLP, Embeddings, LayerFactory, LMHead, ModelOutput, SwiGLU, alibi_slopes,
                                    rope_base, rope_rotate)
from rgpt_dist.models.rt.tiled import naive_scan, scan as tiled_scan   # (names: the HF export ships modules)
from rgpt_dist.models.rt.config import RTConfig

Scan = Callable[..., tuple[torch.Tensor, torch.Tensor]]
OPTIONS: dict[str, tuple[str, ...]] = {
    "residual_scale": ("inv_sqrt_l", "none"), "qk_norm_span": ("head", "width"),
    "qk_norm_type": ("rmsnorm", "layernorm"), "init_scheme": ("normal", "authors"),
    "gelu": ("tanh", "exact"), "alibi_slopes": ("press", "geometric"),
}
"""rt.config.CHOICES (an export replaces that module by its config class, so it is repeated here): the
option's values, the default first, which a config from before the option (an export) gets."""


def option(cfg: Any, name: str) -> str:
    """cfg.<name>, or its default for a config from before the option (an older export's config.json)."""
    return getattr(cfg, name, OPTIONS[name][0])


def head_slopes(cfg: Any) -> list[float]:
    """ALiBi's H slopes (cfg.alibi_slopes): Press et al.'s (layers.alibi_slopes) or 2^(-8h/H), h = 1..H."""
    if option(cfg, "alibi_slopes") == "press":
        return alibi_slopes(cfg.n_head)
    return [2.0 ** (-8.0 * h / cfg.n_head) for h in range(1, cfg.n_head + 1)]


def qk_norm_module(cfg: Any, size: int) -> nn.Module:
    """One QK-norm's parameters over `size` features: RMSNorm (a gain) or LayerNorm (a gain, a bias
    with cfg.bias), eps = ln_eps. RTLayer applies it functionally (its gains are read by the layer)."""
    if option(cfg, "qk_norm_type") == "rmsnorm":
        return nn.RMSNorm(size, eps=cfg.ln_eps)
    return nn.LayerNorm(size, eps=cfg.ln_eps, bias=cfg.bias)


class RTLayer(nn.Module):
    """One RT layer (module docstring). q: d -> d (column), kv: d -> 2 d laid out per head as
    [head, (k|v), head_dim] (column: a shard holds whole heads), proj (O): d -> d (row), the MLP
    (column, row); norms replicated.

    Tensor-parallel cost: the per-position step runs O and the MLP on one position's (B, d), so
    their row-parallel all-reduces happen once per position and layer: 2 S L all-reduces of B x d
    numbers per forward, where a Transformer's tp block has 2 L of B x S x d (the same volume, S
    times the messages: latency-bound at small B). The backward adds, per position and layer, the
    column layers' input-gradient all-reduces on z_t (kv, and the MLP's fc, plus gate with SwiGLU)
    and, with QK-norm, one of k_norm's gain gradient (head_dim numbers: `shared` runs per call of
    `pair`). Counted at tp = 2 (GELU, QK-norm; 2026-12-03): forward 2 S L + 4 all-reduces (+4: the
    embedding's and the vocabulary-parallel cross-entropy's three), backward L (3 S + 2) + 1."""

    def __init__(self, cfg: RTConfig, factory: LayerFactory):
        super().__init__()
        d, std = cfg.d_model, cfg.init_std
        self.head_dim, self.scale = cfg.head_dim, 1.0 / math.sqrt(cfg.head_dim)
        # the residual branches' factor 1/sqrt(L); None: unscaled (residual_scale=none)
        self.branch = 1.0 / math.sqrt(cfg.n_layer) if option(cfg, "residual_scale") == "inv_sqrt_l" else None
        self.ln_1 = layer_norm(cfg)
        self.q = factory.linear(d, d, bias=cfg.bias, parallel="column", init_std=std)
        self.kv = factory.linear(d, 2 * d, bias=cfg.bias, parallel="column", init_std=std)
        self.proj = factory.linear(d, d, bias=cfg.bias, parallel="row", init_std=std)
        self.ln_2 = layer_norm(cfg)
        if mlp_kind(cfg) == "swiglu":
            self.mlp = SwiGLU(cfg, factory, std)
        else:  # gelu=exact: the authors' x Phi(x); tanh: GPT-2's approximation
            self.mlp = MLP(cfg, factory, std, approximate="none" if option(cfg, "gelu") == "exact" else "tanh")
        self.qk_width = option(cfg, "qk_norm_span") == "width"   # one norm over all d features, not per head
        if cfg.qk_norm and self.qk_width and factory.tp_size > 1:
            raise ValueError(f"qk_norm_span='width' needs all d_model features of q and k on one rank; under "
                             f"tensor parallelism (tp_size={factory.tp_size}) a rank holds its heads' only")
        if cfg.qk_norm:
            size = d if self.qk_width else cfg.head_dim
            self.q_norm, self.k_norm = qk_norm_module(cfg, size), qk_norm_module(cfg, size)
            self.shared = factory.shared
        else:
            self.q_norm = self.k_norm = None
        self.rope_base = rope_base(cfg) if cfg.pos_encoding == "rope" else None
        local = cfg.n_head // factory.tp_size  # this rank's heads: a slice of the global slopes
        self.alibi = tuple(head_slopes(cfg)[factory.tp_rank * local:(factory.tp_rank + 1) * local]) \
            if cfg.pos_encoding == "alibi" else None

    # ---- maps (any leading shape (...)) ----------------------------------------------------------
    def _head_norm(self, x: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
        """x (..., H, hd) -> QK-normed (..., H, hd): over each head's hd features, or with qk_norm_span=
        width over all H x hd = d at once; RMS or LayerNorm as the module (qk_norm_module)."""
        if norm is None:
            return x
        y = x.flatten(-2) if self.qk_width else x                      # (..., d) or (..., H, hd)
        gain = self.shared(norm.weight)
        if isinstance(norm, nn.RMSNorm):
            y = F.rms_norm(y, y.shape[-1:], gain, norm.eps)
        else:
            bias = None if norm.bias is None else self.shared(norm.bias)
            y = F.layer_norm(y, y.shape[-1:], gain, bias, norm.eps)
        return y.unflatten(-1, x.shape[-2:]) if self.qk_width else y

    def query(self, xn: torch.Tensor) -> torch.Tensor:
        """xn (..., d) normed -> q (..., H, hd)."""
        return self._head_norm(self.q(xn).unflatten(-1, (-1, self.head_dim)), self.q_norm)

    def pair(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's key/value map of an unnormed input y (..., d) -> k, v (..., H, hd):
        (RMS_h(K RMS_1 y), V RMS_1 y). Temporary pairs from x, persistent ones from z."""
        k, v = self.kv(self.ln_1(y)).unflatten(-1, (-1, 2, self.head_dim)).unbind(-2)
        return self._head_norm(k, self.k_norm), v

    def output(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """x (B, d) the layer input at one position, a (B, H, hd) its attention mix -> z (B, d):
        x + (O a + MLP(RMS_2(x + O a / sqrt(L)))) / sqrt(L); unscaled (residual_scale=none, the
        authors'): h = x + O a, then h + MLP(N_2(h))."""
        o = self.proj(a.flatten(-2))                                   # (B, d)
        if self.branch is None:
            h = x + o                                                  # (B, d)
            return h + self.mlp(self.ln_2(h))
        return x + (o + self.mlp(self.ln_2(x + o * self.branch))) * self.branch

    def slopes(self, like: torch.Tensor) -> torch.Tensor | None:
        return None if self.alibi is None else torch.tensor(self.alibi, dtype=like.dtype, device=like.device)

    def rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """RoPE (pos_encoding=rope) of x (B, H, T, hd) at positions pos (T,); the identity otherwise."""
        return x if self.rope_base is None else rope_rotate(x, pos, self.rope_base)

    # ---- the full-sequence forward (training, prefill) -------------------------------------------
    def forward(self, x: torch.Tensor, scan: Scan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, N, d) at positions 0..N-1 -> (z (B, N, d), persistent k, v each (B, H, N, hd); k
        rotated at its position under RoPE). scan: rt.tiled.scan or naive_scan. The step keeps z_t
        and returns position t's persistent pair."""
        pos = torch.arange(x.shape[1], device=x.device)
        q = self.rotate(self.query(self.ln_1(x)).transpose(1, 2), pos)              # (B, H, N, hd)
        k_tmp, v_tmp = (t.transpose(1, 2) for t in self.pair(x))                    # (B, H, N, hd) each
        k_tmp = self.rotate(k_tmp, pos)
        zs: list[torch.Tensor] = []

        def step(t: int, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            zs.append(self.output(x[:, t], a))                         # (B, d)
            k, v = self.pair(zs[-1])                                   # (B, H, hd) each
            return self.rotate(k[:, :, None], pos[t:t + 1])[:, :, 0], v

        k, v = scan(q, k_tmp, v_tmp, step, scale=self.scale, slopes=self.slopes(q))
        return torch.stack(zs, dim=1), k, v

    # ---- one position with a cache (decoding) ---------------------------------------------------
    def decode(self, x: torch.Tensor, store, position: int | torch.Tensor) -> torch.Tensor:
        """x (B, 1, d) at `position` P (an int, or a (1,) tensor for fixed-shape decoding), store: this
        layer's cached persistent pairs of positions 0..P-1 (P >= 1) -> z (B, 1, d); writes position
        P's persistent pair to the store. One softmax over the cached pairs and the temporary pair
        (ALiBi distances P - j, the temporary pair's 0). A fixed-shape store (slots.index = P) is read
        whole, (B, H, max_len, hd), its slots >= P masked: every step has the same shapes."""
        acc = torch.promote_types(x.dtype, torch.float32)
        fixed = getattr(store, "slots", None) is not None and store.slots.index is not None
        pos = position if isinstance(position, torch.Tensor) else torch.tensor([position], device=x.device)
        q = self.rotate(self.query(self.ln_1(x[:, 0]))[:, :, None], pos)            # (B, H, 1, hd)
        k_tmp, v_tmp = (t[:, :, None] for t in self.pair(x[:, 0]))                  # (B, H, 1, hd) each
        past_k, past_v = (store.k_buf, store.v_buf) if fixed else (store.keys, store.values)  # (B, H, P', hd)
        keys = torch.cat([past_k, self.rotate(k_tmp, pos)], dim=2).to(acc)          # (B, H, P' + 1, hd)
        values = torch.cat([past_v, v_tmp], dim=2).to(acc)
        s = self.scale * (q.to(acc) @ keys.transpose(-1, -2))                       # (B, H, 1, P' + 1)
        j = torch.arange(past_k.shape[2], device=x.device)                          # (P',) cached positions
        dist = torch.cat([(pos - j).to(acc), torch.zeros(1, device=x.device, dtype=acc)])  # (P' + 1,)
        slopes = self.slopes(s)
        if slopes is not None:
            s = s - slopes[:, None, None] * dist
        if fixed:  # slots at or after P hold nothing yet (zeros, or stale entries)
            s = s.masked_fill(torch.cat([j >= pos, torch.zeros(1, dtype=torch.bool, device=x.device)]), float("-inf"))
        a = (torch.softmax(s, dim=-1) @ values)[:, :, 0].to(x.dtype)                # (B, H, hd)
        z = self.output(x[:, 0], a)                                                 # (B, d)
        k, v = self.pair(z)
        store.update(self.rotate(k[:, :, None], pos), v[:, :, None])                 # (B, H, 1, hd) each
        return z[:, None]


def _export_problems(cfg) -> list[str]:
    """A Hugging Face export's config (RGPTConfig: the same fields, no problems(), possibly hand-edited):
    what only this module reads (the shared layers check the block options themselves)."""
    out = [] if cfg.prefill in ("tiled", "naive") else [f"model.prefill={cfg.prefill!r} is not one of tiled, naive"]
    out += [f"model.{name}={option(cfg, name)!r} is not one of {', '.join(allowed)}"
            for name, allowed in OPTIONS.items() if option(cfg, name) not in allowed]
    if option(cfg, "gelu") != "tanh" and mlp_kind(cfg) == "swiglu":
        out.append(f"model.gelu={option(cfg, 'gelu')!r} applies to mlp='gelu' only")
    return out


def authors_init(model: "RT") -> None:
    """init_scheme=authors: OLMo's `mitchell` init (the authors' configs), every draw a normal truncated
    at 3 standard deviations: wte, the untied head, wpe, q, kv and the MLP's input maps 1/sqrt(d);
    layer l's (0-based) attention output 1/sqrt(2 d (l + 1)), MLP output 1/sqrt(2 d_ff (l + 1)); biases
    0 (gains stay 1). Under tensor parallelism each rank draws its own shard (the trainer splits the
    tp = 1 model instead: rgpt_dist.train.run.shard_model)."""
    cfg = model.cfg
    d, f = cfg.d_model, ffn_width(cfg)

    def draw(module: nn.Module | None, std: float) -> None:
        if module is None:
            return
        nn.init.trunc_normal_(module.weight, 0.0, std, -3.0 * std, 3.0 * std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)

    with torch.no_grad():
        for module in (model.embed.wte, model.embed.wpe, getattr(model.embed, "unembed", None)):
            draw(module, d ** -0.5)
        for l, layer in enumerate(model.layers):
            for module in (layer.q, layer.kv, layer.mlp.fc, getattr(layer.mlp, "gate", None)):
                draw(module, d ** -0.5)
            draw(layer.proj, (2 * d * (l + 1)) ** -0.5)
            draw(layer.mlp.proj, (2 * f * (l + 1)) ** -0.5)


class RT(nn.Module):
    """Token embedding -> n_layer RT layers -> final norm -> head (untied unless tie_embeddings)."""

    may_have_unused_params = False  # every parameter receives a gradient every step

    def __init__(self, cfg: RTConfig, factory: LayerFactory | None = None):
        super().__init__()
        factory = factory or LayerFactory()
        problems = cfg.problems("model") if hasattr(cfg, "problems") else _export_problems(cfg)
        if problems:
            raise ValueError("; ".join(problems))
        self.cfg = cfg
        self.embed = Embeddings(cfg, factory)
        self.layers = nn.ModuleList(RTLayer(cfg, factory) for _ in range(cfg.n_layer))
        if not cfg.tie_embeddings:  # the untied head's V x d matrix sits beside wte (embed.unembed: an
            # embedding parameter, as the authors count), vocabulary-parallel like it; the head reads it
            # through factory.lm_logits as it reads a tied wte (LMHead.tied_parameters, for ZeRO-3)
            self.embed.unembed = factory.embedding(cfg.padded_vocab_size, cfg.d_model, parallel="column",
                                                   init_std=cfg.init_std)
        self.head = LMHead(cfg, factory, self.embed.wte if cfg.tie_embeddings else self.embed.unembed)
        if option(cfg, "init_scheme") == "authors":
            authors_init(self)

    def scan(self) -> Scan:
        return tiled_scan if self.cfg.prefill == "tiled" else naive_scan

    def checkpoint_units(self, mode: str) -> list[nn.Module]:
        """Every layer (any mode): its forward is a pure function of its input."""
        return list(self.layers)

    def make_cache(self, strategy: str = "full", r: int | None = None, max_len: int | None = None,
                   fixed: bool = False, store: Callable[[], Any] | None = None) -> KVCache:
        """An empty cache of each layer's persistent K/V (n_layer stores; static of max_len tokens,
        default block_size; fixed: for fixed-shape, compiled, decoding: rgpt_dist.models.kv_cache), or
        dynamic ones made by `store` (the Hugging Face export's transformers DynamicLayers; not with
        max_len or fixed). Only `full` (the persistent pairs are exact: there is nothing to compress)
        and no depth r."""
        if r is not None:
            raise ValueError(f"RT has no recurrence depth: r={r} is not supported")
        if strategy != "full":
            raise ValueError(f"RT's KV cache strategy must be 'full', got {strategy!r} (the persistent pairs are "
                             "the layer's own outputs; no compressed strategy is defined)")
        if store is not None:  # (KVCache refuses store with max_len or fixed, naming both)
            return KVCache(self.cfg.n_layer, strategy=strategy, block_size=self.cfg.block_size, store=store,
                           max_len=max_len, fixed=fixed)
        return KVCache(self.cfg.n_layer, strategy=strategy, block_size=self.cfg.block_size,
                       max_len=self.cfg.block_size if max_len is None else max_len, fixed=fixed)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, r: int | None = None,
                all_exits: bool = False, noise_key: object = None, cache: KVCache | None = None,
                stats: bool = False, mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> ModelOutput:
        """idx, targets: (B, T). cache: from make_cache (inference): an empty one is prefilled with
        idx by the scan, a non-empty one extended one position at a time. A fixed-shape step (the
        cache's slots.index holding the new token's position, as generate's compiled step sets it)
        reads its position from there: its mask and positions must agree and are otherwise unused.
        r, all_exits (no depth), mask and positions elsewhere (padded batches) are refused; noise_key
        and stats are accepted and unused."""
        if r is not None or all_exits:
            raise ValueError(f"RT has no recurrence depth: r={r} and all_exits={all_exits} are not supported")
        T = idx.shape[1]
        index = None if cache is None or cache.slots is None else cache.slots.index   # (1,) or None
        if (mask is not None or positions is not None) and (index is None or T != 1):
            raise ValueError("RT does not support padded batches (mask / positions): its persistent pairs "
                             "would have to skip padded positions inside the scan")
        past = 0 if cache is None else cache.begin(T, r, self.training)
        if past == 0 and index is None:
            h = self.embed(idx)                                        # (B, T, d)
            for j, layer in enumerate(self.layers):
                h, k, v = layer(h, self.scan())
                if cache is not None:
                    cache.layers[j].update(k, v)                       # (B, H, T, hd) each
        elif index is not None:
            h = self._decode(idx, index, cache)
        else:
            h = torch.cat([self._decode(idx[:, i:i + 1], past + i, cache) for i in range(T)], dim=1)
        logits, loss = self.head(h, targets)
        if cache is not None:
            cache.end(T)
        return ModelOutput(loss=loss, logits=logits)

    def _decode(self, tok: torch.Tensor, position: int | torch.Tensor, cache: KVCache) -> torch.Tensor:
        """tok (B, 1) at `position` (> 0: an int, or the fixed-shape cache's (1,) index) -> the last
        layer's output (B, 1, d), writing each layer's persistent pair to its store."""
        if isinstance(position, torch.Tensor):   # learned positions read wpe at the tensor's position
            h = self.embed(tok, 0, position.expand(tok.shape[0], 1))
        else:
            h = self.embed(tok, position)
        for layer, store in zip(self.layers, cache.layers):
            h = layer.decode(h, store, position)
        return h
