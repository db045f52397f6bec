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
r = 0 runs the prelude then the coda. `all_exits` applies coda + head to every h^(k), k = 0..r.
With a KV cache (`make_cache`, inference), idx holds only the tokens after the cached ones; the
shared core's cache keeps every step's K/V (`full`) or one compressed K/V per token (kv_cache.py).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from rgpt_dist.models.recurrent_gpt.config import RecurrentGPTConfig
from rgpt_dist.models.kv_cache import KVCache, LayerCache
from rgpt_dist.models.layers import Block, Embeddings, LayerFactory, LMHead, ModelOutput, layer_norm, residual_std
from rgpt_dist.noise import NoiseKey


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
        # W_proj [h, h_pre] as two d x d halves, row-parallel: each tp rank reads its slice of the
        # replicated input and the partial products are summed across ranks
        self.proj_h = factory.linear(d, d, bias=False, parallel="row", input_is_parallel=False, init_std=std)
        self.proj_pre = factory.linear(d, d, bias=False, parallel="row", input_is_parallel=False, init_std=std)
        self.blocks = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_rec))
        self.ln_h = layer_norm(cfg)
        self.ln_pre = layer_norm(cfg)
        # f_g: layer 1 (split in its LN(h) and LN(h_pre) halves) column-parallel, layer 2 row-parallel
        self.gate_h = factory.linear(d, d, bias=True, parallel="column", init_std=std)
        self.gate_pre = factory.linear(d, d, bias=False, parallel="column", init_std=std)
        self.gate_out = factory.linear(d, d, bias=True, parallel="row", init_std=std)
        with torch.no_grad():
            self.gate_out.bias.fill_(cfg.gate_bias_init)

    def anchor(self, h_pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The step-invariant terms: (W_pre h_pre, gate layer 1 on LN(h_pre)), each (B, T, d)."""
        return self.proj_pre(h_pre), self.gate_pre(self.ln_pre(h_pre))

    def forward(self, h: torch.Tensor, anchor: tuple[torch.Tensor, torch.Tensor], key: NoiseKey | None,
                caches: list[LayerCache] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """h: (B, T, d); anchor: from `anchor(h_pre)`; key: this step's noise key, None for no noise;
        caches: this step's K/V cache of each core block (KVCache.core_step), or None. Returns (h_next, g)."""
        proj_pre, gate_pre = anchor
        x = h
        if key is not None and self.sigma_x > 0:
            x = h + key.normal("x", h.shape, self.sigma_x, h.device, h.dtype)
        o = self.proj_h(x) + proj_pre                                      # h~ = W_proj [h + eps_x, h_pre]
        for block, cache in zip(self.blocks, caches or [None] * len(self.blocks)):
            o = block(o, cache)                                            # (B, T, d)
        logit = self.gate_out(F.silu(self.gate_h(self.ln_h(h)) + gate_pre)) / self.tau
        if key is not None and self.sigma_g > 0:
            logit = logit + key.normal("g", logit.shape, self.sigma_g, h.device, logit.dtype)
        g = torch.sigmoid(logit)                                           # (B, T, d)
        # g * h + (1 - g) * o in the residual stream's dtype (under autocast o and g arrive in bf16)
        return torch.lerp(o.to(h.dtype), h, g.to(h.dtype)), g


class RecurrentGPT(nn.Module):
    may_have_unused_params = False  # W_proj, core and gate get gradients for every r >= 1

    def __init__(self, cfg: RecurrentGPTConfig, factory: LayerFactory | None = None):
        super().__init__()
        factory = factory or LayerFactory()
        self.cfg = cfg
        # Scaled residual init over the blocks one forward executes at the maximum depth.
        out_std = residual_std(cfg, cfg.n_pre + cfg.n_rec * cfg.n_loops + cfg.n_coda)
        self.embed = Embeddings(cfg, factory)
        self.prelude = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_pre))
        self.recurrence = GatedRecurrence(cfg, factory, out_std)
        self.coda = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_coda))
        self.head = LMHead(cfg, factory, self.embed.wte)

    def checkpoint_units(self, mode: str) -> list[nn.Module]:
        """Modules whose activations are recomputed in backward: the recurrence step (called r
        times per forward), and with mode 'blocks' also every prelude and coda block."""
        extra = list(self.prelude) + list(self.coda) if mode == "blocks" else []
        return [self.recurrence] + extra

    def make_cache(self, strategy: str = "full", r: int | None = None) -> KVCache:
        """An empty KV cache for forwards at depth r (default R): ordinary caches for the prelude and
        coda, and for the shared core one per (step, block) with `full`, or one per block with the
        compressed `first`, `last`, `average` (see rgpt_dist.models.kv_cache)."""
        r = self.cfg.n_loops if r is None else int(r)
        return KVCache(self.cfg.n_pre + self.cfg.n_coda, self.cfg.n_rec, strategy, r, self.cfg.block_size)

    def _readout(self, h: torch.Tensor, targets: torch.Tensor | None, caches: list | None = None):
        for block, cache in zip(self.coda, caches or [None] * len(self.coda)):
            h = block(h, cache)
        return self.head(h, targets)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, r: int | None = None,
                all_exits: bool = False, noise_key: NoiseKey | None = None,
                cache: KVCache | None = None) -> ModelOutput:
        """idx, targets: (B, T). r: recurrence depth (default R = n_loops; any r >= 0, also beyond R).
        all_exits: also return aux['exit_losses'] (r + 1,) = loss of coda+head on h^(0..r).
        noise_key: identifies this micro-batch's noise in training (a fresh one if None).
        cache: from `make_cache(strategy, r)`, holding the tokens before idx (inference only, same r
        on every call); idx is appended to it."""
        r = self.cfg.n_loops if r is None else int(r)
        if r < 0:
            raise ValueError(f"recurrence depth r={r} must be >= 0")
        if all_exits and (targets is None or cache is not None):
            raise ValueError("all_exits needs targets (it returns the loss of every exit) and no cache")
        if not self.training:
            noise_key = None
        elif noise_key is None:
            noise_key = NoiseKey.fresh()
        past = 0 if cache is None else cache.begin(idx.shape[1], r, self.training)
        n_pre = self.cfg.n_pre
        pre_caches, coda_caches = (None, None) if cache is None else (cache.layers[:n_pre], cache.layers[n_pre:])

        h = self.embed(idx, past)                                          # (B, T, d)
        for block, block_cache in zip(self.prelude, pre_caches or [None] * n_pre):
            h = block(h, block_cache)
        anchor = self.recurrence.anchor(h) if r > 0 else None             # h_pre terms, once
        exit_losses = [self._readout(h, targets)[1]] if all_exits and r > 0 else []
        gate_stats = []
        for i in range(r):
            h, g = self.recurrence(h, anchor, None if noise_key is None else noise_key.at(i),
                                   None if cache is None else cache.core_step(i))
            g = g.detach().float()
            gate_stats.append(torch.stack([g.mean(), g.std(), (g > 0.95).float().mean(), (g < 0.05).float().mean()]))
            if all_exits and i < r - 1:
                exit_losses.append(self._readout(h, targets)[1])
        logits, loss = self._readout(h, targets, coda_caches)
        if cache is not None:
            cache.end(idx.shape[1])
        aux = {"depth": r}
        if r > 0:  # per step: mean, std, fraction > 0.95 (copy), fraction < 0.05 (write)
            stats = torch.stack(gate_stats)                                 # (r, 4)
            aux.update(gate_mean=stats[:, 0], gate_std=stats[:, 1], gate_hi=stats[:, 2], gate_lo=stats[:, 3])
        if all_exits:
            aux["exit_losses"] = torch.stack(exit_losses + [loss])          # (r + 1,)
        return ModelOutput(loss=loss, logits=logits, aux=aux)
