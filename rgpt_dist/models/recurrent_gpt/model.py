"""RecurrentGPT: prelude -> gated shared core applied r times -> coda (SPEC section 1, paper Eqs. 2-5).

    h      = wte(idx) + wpe(pos)                              (B, T, d)
    h_pre  = prelude(h)                                       fixed anchor for every step
    h^(0)  = h_pre
    step i = 1..r:
      h~   = W_proj [h^(i-1) + eps_x, h_pre]                  (B, T, 2d) -> (B, T, d)
      o    = core(h~)                                         n_rec shared blocks, same weights each step
      g    = sigmoid(f_g([LN(h^(i-1)), LN(h_pre)]) / tau + eps_g)   f_g: 2d -> d -> d, SiLU
      h^(i)= g * h^(i-1) + (1 - g) * o
    logits = head(coda(h^(r)))                                (B, T, V)

eps_x ~ N(0, sigma_x^2) per element and eps_g ~ N(0, sigma_g^2) per gate scalar are drawn in training
only, from keyed generators (rgpt_dist.noise), so recomputation redraws the same values.
r = 0 runs the prelude then the coda. `all_exits` applies coda + head to every h^(k), k = 0..r;
`stats` returns the gate statistics of every step. Embeddings, prelude, coda, head, KV cache and the
forward loop are the shared skeleton (rgpt_dist.models.looped).

Two stability ingredients of the silent-thinking paper (related_abstracts.txt, first abstract), as
switches (issue #28):
- LayerScale, cfg.layerscale > 0: each core block becomes x + gamma_1 * attn(LN(x)), then
  x + gamma_2 * mlp(LN(x)), gamma_k (d,) learned, initialised to cfg.layerscale. The core only, as
  the paper's recurrent block: the prelude and coda blocks stay plain. 0 (default): no gains, no
  parameters, the model bitwise as before. At a small init the core is near identity on its input,
  which here is h~ = W_proj [h + eps_x, h_pre], not h: o ~ h~ (the paper's block returns about
  its own input, h plus a depth embedding).
- The identity-biased gate is this model's gate, with the convention flipped: the paper writes
  h <- z h' + (1 - z) h, z = sigmoid(W_z [h'; h] + b_z), b_z = -2 (z weights the new state h');
  here g weights the old state, so its b_z = -2 is gate_bias_init = +2 (keep sigmoid(2) = 0.881 of
  h^(i-1) at init, tau = 1). What the gate reads differs: the paper's single linear map reads the
  block's output h' and the old state h, raw; f_g here reads [LN(h^(i-1)), LN(h_pre)] (old state
  and prelude anchor, not the candidate o) through Linear -> SiLU -> Linear, divided by tau, with
  noise eps_g in training. No [o; h] gate input is offered.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from rgpt_dist.models.recurrent_gpt.config import RecurrentGPTConfig
from rgpt_dist.models.kv_cache import LayerCache
from rgpt_dist.models.layers import Block, Deltas, LayerFactory, layer_norm
from rgpt_dist.models.looped import LoopedLM
from rgpt_dist.noise import NoiseKey


def layerscale_init(cfg) -> float:
    """cfg.layerscale: 0.0 for a config from before the field (an older export's config.json); a
    value RecurrentGPTConfig.problems would refuse (a hand-edited config.json) is refused here."""
    value = getattr(cfg, "layerscale", 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"layerscale={value!r} must be a finite number >= 0")
    return float(value)


class LayerScaleBlock(Block):
    """Block with LayerScale (Touvron et al. 2021) on both residual branches:

        x = x + gamma_1 * attn(LN(x)),   x = x + gamma_2 * mlp(LN(x)),   gamma_k (d,) = `init` at init

    The gains are plain parameters over the residual width, created after the block's layers (which
    draw the same random init as a Block's): replicated under tensor parallelism like a norm's
    gain (each multiplies the row-parallel output after its all-reduce, so every rank computes the
    same gradient), 1-D so never weight-decayed, and partitioned by ZeRO as any parameter."""

    def __init__(self, cfg, factory: LayerFactory, out_std: float, init: float):
        super().__init__(cfg, factory, out_std)
        self.ls_1 = nn.Parameter(torch.full((cfg.d_model,), init))
        self.ls_2 = nn.Parameter(torch.full((cfg.d_model,), init))

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, delta: Deltas | None = None,
                mask: torch.Tensor | None = None, pos: torch.Tensor | None = None) -> torch.Tensor:
        """As Block.forward, each branch's output (B, T, d) scaled per channel before the residual add."""
        x = x + self.ls_1 * self.attn(self.ln_1(x), cache, delta, mask, pos)
        return x + self.ls_2 * self.mlp(self.ln_2(x), delta)


class GatedRecurrence(nn.Module):
    """One recurrence step (Eqs. 2-5). Called r times per forward; activation checkpointing wraps
    this module, so everything a step needs, its noise included, is computed inside it.

    W_proj [x, h_pre] = W_h x + W_pre h_pre, and likewise the gate's first layer: the h_pre halves are
    the same at every step, so `anchor` computes them once per forward (saving 4 d^2 of Eq. 1's
    10 d^2 FLOPs per token and step) and each step applies only the halves that read h^(i-1).
    """

    def __init__(self, cfg: RecurrentGPTConfig, factory: LayerFactory, out_std: float):
        super().__init__()
        d, std = cfg.d_model, cfg.init_std
        self.sigma_x, self.sigma_g, self.tau = cfg.sigma_x, cfg.sigma_g, cfg.tau
        self.injection, self.gated, self.noise_every_step = cfg.injection, cfg.gate == "learned", \
            cfg.state_noise == "every_step"
        # W_proj [h, h_pre] as two d x d halves, row-parallel: each tp rank reads its slice of the
        # replicated input and the partial products are summed across ranks. The ablations' switches
        # leave out modules (created in this order otherwise, so the full model's init is unchanged)
        if cfg.injection != "none":
            self.proj_h = factory.linear(d, d, bias=False, parallel="row", input_is_parallel=False, init_std=std)
        if cfg.injection == "concat":
            self.proj_pre = factory.linear(d, d, bias=False, parallel="row", input_is_parallel=False, init_std=std)
        ls = layerscale_init(cfg)  # 0: plain Blocks (no gains: the state dict as before LayerScale)
        self.blocks = nn.ModuleList(LayerScaleBlock(cfg, factory, out_std, ls) if ls > 0
                                    else Block(cfg, factory, out_std) for _ in range(cfg.n_rec))
        if self.gated:
            self.ln_h = layer_norm(cfg)
            self.ln_pre = layer_norm(cfg)
            # f_g: layer 1 (split in its LN(h) and LN(h_pre) halves) column-parallel, layer 2 row-parallel
            self.gate_h = factory.linear(d, d, bias=True, parallel="column", init_std=std)
            self.gate_pre = factory.linear(d, d, bias=False, parallel="column", init_std=std)
            self.gate_out = factory.linear(d, d, bias=True, parallel="row", init_std=std)
            with torch.no_grad():
                self.gate_out.bias.fill_(cfg.gate_bias_init)

    def anchor(self, h_pre: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The step-invariant terms: (W_pre h_pre, gate layer 1 on LN(h_pre)), each (B, T, d), or
        None where the configuration has no injection or no gate."""
        return (self.proj_pre(h_pre) if self.injection == "concat" else None,
                self.gate_pre(self.ln_pre(h_pre)) if self.gated else None)

    def forward(self, h: torch.Tensor, anchor: tuple[torch.Tensor, torch.Tensor], i: int, key: NoiseKey | None,
                caches: list[LayerCache] | None = None, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """h: (B, T, d); anchor: from `anchor(h_pre)`; i: the step (the same weights at every step);
        key: this step's noise key, None for no noise; caches: this step's K/V cache of each core
        block (KVCache.core_step), or None; mask: for padded batches. Returns (h_next, g); g is
        None without a gate (model.gate=none: h_next = o)."""
        proj_pre, gate_pre = anchor
        x = h
        if key is not None and self.sigma_x > 0 and (self.noise_every_step or i == 0):
            x = h + key.normal("x", h.shape, self.sigma_x, h.device, h.dtype)
        if self.injection == "concat":
            o = self.proj_h(x) + proj_pre                                  # h~ = W_proj [h + eps_x, h_pre]
        else:                                                              # the ablations: W_h x, or x
            o = self.proj_h(x) if self.injection == "state" else x
        for block, cache in zip(self.blocks, caches or [None] * len(self.blocks)):
            o = block(o, cache, None, mask)                                # (B, T, d)
        if not self.gated:
            return o.to(h.dtype), None
        logit = self.gate_out(F.silu(self.gate_h(self.ln_h(h)) + gate_pre)) / self.tau
        if key is not None and self.sigma_g > 0:
            logit = logit + key.normal("g", logit.shape, self.sigma_g, h.device, logit.dtype)
        g = torch.sigmoid(logit)                                           # (B, T, d)
        # g * h + (1 - g) * o in the residual stream's dtype (under autocast o and g arrive in bf16)
        return torch.lerp(o.to(h.dtype), h, g.to(h.dtype)), g


class RecurrentGPT(LoopedLM):
    """The gated recurrence on the shared prelude/core/coda skeleton (rgpt_dist.models.looped)."""

    def __init__(self, cfg: RecurrentGPTConfig, factory: LayerFactory | None = None):
        super().__init__(cfg, factory, lambda factory, out_std: GatedRecurrence(cfg, factory, out_std))

    def start(self, h_pre: torch.Tensor, r: int, noise_key: NoiseKey | None, past: int, positions=None):
        """h^(0) = h_pre; the anchor holds the h_pre terms of W_proj and the gate, computed once."""
        return h_pre, self.recurrence.anchor(h_pre) if r > 0 else None

    def step_statistics(self, g: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Per step: gate mean, std, fraction > 0.95 (copy), fraction < 0.05 (write); none without a gate."""
        if g is None:
            return {}
        g = g.detach().float()
        return {"gate_mean": g.mean(), "gate_std": g.std(), "gate_hi": (g > 0.95).float().mean(),
                "gate_lo": (g < 0.05).float().mean()}
