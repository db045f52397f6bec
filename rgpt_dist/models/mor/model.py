"""Mixture-of-Recursions (Bae et al. 2025; SPEC section 4), expert-choice routing (token choice as
an option), on the prelude / shared core / coda skeleton (rgpt_dist.models.looped). Plain PyTorch.

    h^(0) = prelude(embed(idx));  A^(-1) = every token                  (B, T, d); (B, T) bool
    recursion i = 0..min(r, N)-1 (N = n_loops, capacity c_i = (N - i) / N; steps beyond N run nothing):
      z_i        = w_i . h^(i)                                         router logit (B, T), fp32
      S_i        = training: the k_i = ceil(c_i T) tokens of A^(i-1) with the largest z_i, per sequence
                   inference (threshold): {t in A^(i-1) : z_i,t > 0}, every candidate where c_i = 1
      x          = h^(i)[S_i], in position order                       (B, k_i, d)
      o          = core(x)                                             causal attention among S_i only
      h^(i+1)[S_i] = x + alpha sigmoid(z_i[S_i]) (o - x);  other tokens unchanged;  A^(i) = S_i
    logits = head(coda(h^(r)))
    aux_loss = coef * sum_i mean_{t in A^(i-1)} BCE(sigmoid(z_i,t), [t in S_i])
               (+ z_coef * sum_i mean_{t in A^(i-1)} z_i,t^2 with `router_z_coef` > 0)

The update scales the core's residual-free change (o - x), as Mixture-of-Depths does (`update=delta`);
`update=residual` is the MoR authors' x + g o (o includes x: the gate scales the whole output). Training
gathers the selected tokens (B, k_i, d), so every rank runs the same shapes and a recursion costs
c_i of a full one; the router learns its own gradient through g (top-k itself has none).
Top-k looks at every token's score, future ones included, so inference routes causally by default:
a candidate stays where its own score says so (what the BCE loss trains), computed on every token
with the unselected ones masked out as keys (`inference_routing=top_k` evaluates the training
routing instead). r < N exits early; r > N runs nothing more (capacity 0).

Token choice (`routing=token`): p = softmax(W h^(0)) over the N depths picks each token's depth
(argmax + 1) once, before the first recursion; the token is updated by recursions 0..depth-1 with
g = alpha p(depth), and the auxiliary loss is Switch Transformer's balancing loss over the depths.
It is causal by construction, so training and inference route alike; the counts differ between
sequences, so it runs on every token with the unselected masked (no FLOPs saved, see the spec).
`router_gate_at=exit` (the MoR authors' code): recursions 0..depth-2 update ungated (h <- core(h)),
the last one returns h^(0) + g (o - h^(0)) (or h^(0) + g o with `update=residual`); the z-loss adds
z_coef * mean_t logsumexp_j(W h^(0))_j^2 to the balancing loss.

Evaluation with every exit (`all_exits`, the trainer's) of expert choice also runs both routings
from the same prelude output and reports aux['eval_metrics'] (`routing_comparison`): the loss of the
routing that is not `inference_routing`, and `router_agreement`.

KV cache, MoR's two options: recursion-wise caching (`full`): per recursion, one K/V store per core
block and one more whose keys are the tokens' routes (B, 1, T, 1; values empty), so a later token
attends at recursion i only to the earlier tokens that recursion selected; recursive KV sharing
(`first`): the cache keeps each token's first-recursion K/V (every token runs it) and every
recursion of a later token attends to those (the compressed `first` cache: its route store keeps
the first recursion's routes, all ones). Being ordinary stores, they follow the static buffers, the
fixed-shape decode and the Hugging Face cache's crop and beam reordering.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from rgpt_dist.models.kv_cache import KVCache
from rgpt_dist.models.layers import Block, LayerFactory, ModelOutput
from rgpt_dist.models.looped import LoopedLM
from rgpt_dist.models.mor.config import MoRConfig
from rgpt_dist.noise import NoiseKey


def capacity(n_loops: int, i: int) -> float:
    """c_i = (N - i) / N: the fraction of tokens recursion i (0-based) may keep (0 beyond N)."""
    return max(n_loops - i, 0) / n_loops


def top_k_positions(z: torch.Tensor, candidates: torch.Tensor, k: int) -> torch.Tensor:
    """The k candidates (B, T) bool with the largest z (B, T) in each row, in position order: (B, k).
    k never exceeds a row's candidate count (capacities shrink), so no non-candidate is picked."""
    return z.masked_fill(~candidates, float("-inf")).topk(k, dim=1).indices.sort(dim=1).values


class Router(nn.Module):
    """One linear scorer w_i (d,) per recursion, no bias; scores in >= fp32 (top-k on bf16 scores ties).
    A module called at every step, so ZeRO-3 gathers its weight like any other (replicated under tp)."""

    def __init__(self, cfg: MoRConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cfg.n_loops, cfg.d_model) * cfg.init_std)  # (N, d)

    def depth_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Token choice's logits over the N depths, (B, T, d) -> (B, T, N): the module's forward
        (what ZeRO-3's hooks gather the weight for) with i None."""
        return self(h, None)

    def forward(self, h: torch.Tensor, i: int | None) -> torch.Tensor:
        """h (B, T, d) -> z_i (B, T) in fp32 (fp64 for fp64 h); i None: every w_i, F.linear."""
        if i is None:
            return F.linear(h, self.weight.to(h.dtype))
        dtype = torch.promote_types(h.dtype, torch.float32)
        return (h.to(dtype) * self.weight[i].to(dtype)).sum(-1)


class Recursion(nn.Module):
    """One recursion (the unit activation checkpointing wraps): route, run the shared core on the
    selected tokens, update them. State s = (h (B, T, d), candidates (B, T) bool)."""

    def __init__(self, cfg: MoRConfig, factory: LayerFactory, out_std: float):
        super().__init__()
        self.n_loops, self.alpha, self.routing = cfg.n_loops, cfg.router_alpha, cfg.inference_routing
        self.update, self.gate_at = cfg.update, cfg.router_gate_at
        self.blocks = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_rec))
        self.router = Router(cfg)

    def forward(self, s: tuple[torch.Tensor, torch.Tensor], anchor, i: int, key: NoiseKey | None,
                caches: list | None = None, mask: torch.Tensor | None = None, routing: str | None = None):
        """s: (h, candidates); anchor: token-choice's (depth (B, T), g (B, T), probs (B, T, N),
        logits (B, T, N), h^(0) (B, T, d) or None) from `MixtureOfRecursionsGPT.start`, None for
        expert choice; caches: this step's core block stores + the route store, or None; mask:
        (B, 1, T, K) for padded batches or fixed-shape decoding; routing: an eval-mode routing
        other than `inference_routing` (`routing_comparison`).
        Returns ((h', selected), extra) for the auxiliary loss and statistics (None beyond N)."""
        if i >= self.n_loops:                                                  # capacity 0: nothing runs
            return s, None
        h, cand = s
        if anchor is not None:                                                 # token choice: causal
            depth, g, probs, logits, h0 = anchor
            sel = cand & (depth > i)
            return (self._token_step(h, sel, depth == i + 1, g, h0, caches, mask), sel), \
                {"sel": sel, "g": g, "probs": probs if i == 0 else None, "logits": logits if i == 0 else None,
                 "depth": depth}
        z = self.router(h, i)                                                  # (B, T) fp32
        g = self.alpha * torch.sigmoid(z)
        if self.training or (routing or self.routing) == "top_k":
            if caches is not None or mask is not None:
                raise ValueError("top-k routing looks at the whole sequence: it takes no cache or mask "
                                 "(inference_routing=threshold routes causally)")
            h_next, sel = self._gathered(h, z, g, cand, i)
        else:
            sel = cand if capacity(self.n_loops, i) >= 1 else cand & (z > 0)
            h_next = self._masked(h, sel, g, caches, mask)
        return (h_next, sel), {"z": z, "cand": cand, "sel": sel}

    def choose_depths(self, h0: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Token choice: p = softmax(W h^(0)) over the N depths (B, T, N); each token runs the
        argmax + 1 recursions, its updates scaled by alpha p(chosen). (depth, g, p, logits in >= fp32)."""
        logits = self.router.depth_logits(h0)                                  # (B, T, N)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        probs = torch.softmax(logits, dim=-1)
        chosen = probs.max(dim=-1)
        return chosen.indices + 1, self.alpha * chosen.values, probs, logits

    def _update(self, x: torch.Tensor, o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """`delta`: x + g (o - x); `residual`: x + g o; in x's dtype (under autocast o arrives in
        bf16); g (..., T)."""
        if self.update == "residual":
            return x + g.to(x.dtype)[..., None] * o.to(x.dtype)
        return x + g.to(x.dtype)[..., None] * (o.to(x.dtype) - x)

    def _gathered(self, h, z, g, cand, i):
        """Top-k routing: gather the kept tokens (B, k, d), run the core on them, scatter back."""
        B, T, d = h.shape
        k = math.ceil(capacity(self.n_loops, i) * T)
        pos = top_k_positions(z, cand, k)                                      # (B, k)
        x = h.gather(1, pos[..., None].expand(B, k, d))                        # (B, k, d)
        o = x
        for block in self.blocks:  # causal among the kept, at their own positions (rope, alibi)
            o = block(o, None, None, None, pos)
        h_next = h.scatter(1, pos[..., None].expand(B, k, d), self._update(x, o, g.gather(1, pos)))
        return h_next, torch.zeros_like(cand).scatter(1, pos, True)

    def _masked(self, h, sel, g, caches, mask):
        """The core on every token; unselected tokens (sel False) are hidden as keys, not updated."""
        return torch.where(sel[..., None], self._update(h, self._core_masked(h, sel, caches, mask), g), h)

    def _token_step(self, h, sel, exits, g, h0, caches, mask):
        """Token choice's recursion on the selected tokens: gated at every recursion (`every`), or
        (`exit`) ungated before a token's last recursion (exits (B, T): depth == i + 1) and, at it,
        the update of h^(0) (B, T, d) by the chain's output."""
        if self.gate_at == "every":
            return self._masked(h, sel, g, caches, mask)
        o = self._core_masked(h, sel, caches, mask).to(h.dtype)
        return torch.where((sel & exits)[..., None], self._update(h0, o, g), torch.where(sel[..., None], o, h))

    def _core_masked(self, h, sel, caches, mask):
        """The core's output (B, T, d) on every token, the unselected (sel False) hidden as keys."""
        B, T, _ = h.shape
        route = sel.to(h.dtype)[:, None, :, None]                              # (B, 1, T, 1)
        keys = sel if caches is None else caches[-1].update(route, route[..., :0])[0][:, 0, :, 0] > 0.5  # (B, K)
        K = keys.shape[1]
        if mask is None:                                                       # causal, past = K - T
            mask = (torch.arange(T, device=h.device)[:, None] + K - T >= torch.arange(K, device=h.device))[None, None]
        # selected queries see selected keys only (themselves included); unselected ones keep their
        # whole row so no row is empty (their output is discarded)
        mask = mask & (keys[:, None, None, :] | ~sel[:, None, :, None])        # (B, 1, T, K)
        o = h
        for block, cache in zip(self.blocks, [None] * len(self.blocks) if caches is None else caches[:-1]):
            o = block(o, cache, None, mask)
        return o


class MixtureOfRecursionsGPT(LoopedLM):
    """Mixture-of-Recursions (expert or token choice) on the shared prelude/core/coda skeleton."""

    def __init__(self, cfg: MoRConfig, factory: LayerFactory | None = None):
        super().__init__(cfg, factory, lambda factory, out_std: Recursion(cfg, factory, out_std))

    def start(self, h_pre: torch.Tensor, r: int, noise_key: NoiseKey | None, past: int, positions=None):
        """Every token is a candidate for the first recursion; token choice picks the depths here
        (the anchor: choose_depths' tuple and h^(0), kept for `router_gate_at=exit` only)."""
        cand = torch.ones(h_pre.shape[:2], dtype=torch.bool, device=h_pre.device)
        if self.cfg.routing != "token" or r == 0:
            return (h_pre, cand), None
        h0 = h_pre if self.cfg.router_gate_at == "exit" else None
        return (h_pre, cand), (*self.recurrence.choose_depths(h_pre), h0)

    def hidden(self, s: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return s[0]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, r: int | None = None,
                all_exits: bool = False, **kwargs) -> ModelOutput:
        """LoopedLM.forward; with all_exits in eval mode (the trainer's evaluation), expert choice
        without a padding mask also returns aux['eval_metrics'] = `routing_comparison`."""
        out = super().forward(idx, targets, r, all_exits, **kwargs)
        if all_exits and not self.training and self.cfg.routing == "expert" and kwargs.get("mask") is None:
            out.aux["eval_metrics"] = self.routing_comparison(idx, targets, out.aux["depth"])
        return out

    @torch.no_grad()
    def routing_comparison(self, idx: torch.Tensor, targets: torch.Tensor, r: int) -> dict[str, torch.Tensor]:
        """Expert choice at depth r, routed both ways from one prelude output (two more passes of the
        recursions, one of the coda and head): {`val_loss_topk` or `val_loss_threshold` (the routing that is
        not `inference_routing`, whose loss is the forward's own): its loss, `router_agreement`}.

        router_agreement: with m = min(r, N) and S_i^X (b) the tokens of row b that recursion i
        updates when every recursion routes by X (each routing following its own, nested candidates,
        so a token dropped earlier counts as not updated), the fraction of (token, recursion)
        decisions the two routings make alike over the recursions that decide (1..m-1; recursion 0
        keeps every token under both):
            (1 / (B T (m - 1))) sum_{i=1..m-1} sum_{b, t} 1[t in S_i^top_k(b)  <=>  t in S_i^threshold(b)]
        1.0 where no recursion decides (m <= 1)."""
        main = self.cfg.inference_routing
        other = "threshold" if main == "top_k" else "top_k"
        h = self.embed(idx, 0, None)
        for block in self.prelude:
            h = block(h, None, None, None)
        routes = {}
        for routing in (main, other):
            s, _ = self.start(h, r, None, 0, None)
            routes[routing] = []
            for i in range(min(r, self.cfg.n_loops)):
                s, extra = self.recurrence(s, None, i, None, routing=routing)
                routes[routing].append(extra["sel"])                           # (B, T) bool
        loss = self.readout(self.hidden(s), targets)[1]                        # the other routing's
        agree = [(a == b).double().mean() for a, b in zip(routes[main][1:], routes[other][1:])]
        agreement = torch.stack(agree).mean() if agree else torch.ones((), dtype=torch.float64, device=h.device)
        return {f"val_loss_{other.replace('_', '')}": loss, "router_agreement": agreement}

    def step_aux_loss(self, extra) -> torch.Tensor | None:
        """Expert choice: coef x mean BCE of sigmoid(z) against the routes, over the step's
        candidates. Token choice, once: coef x the balancing loss N sum_j f_j P_j (f_j: the
        fraction of tokens choosing depth j, P_j: their mean probability of it; Switch
        Transformer's). Either plus the z-loss where router_z_coef > 0 (config). None beyond N,
        where no recursion runs."""
        if extra is None:
            return None
        if "z" in extra:
            z, cand, sel = extra["z"], extra["cand"], extra["sel"]
            bce = F.binary_cross_entropy_with_logits(z, sel.to(z.dtype), reduction="none")
            loss = self.cfg.router_aux_coef * (bce * cand).sum() / cand.sum().clamp(min=1)
            if self.cfg.router_z_coef:                                         # z-loss: lse of one logit = z
                loss = loss + self.cfg.router_z_coef * (z.square() * cand).sum() / cand.sum().clamp(min=1)
            return loss
        if extra["probs"] is None:                                             # token choice after step 0
            return None
        probs, depth = extra["probs"], extra["depth"]
        N = probs.shape[-1]
        f = F.one_hot(depth - 1, N).to(probs.dtype).mean((0, 1))              # (N,)
        loss = self.cfg.router_aux_coef * N * (f * probs.mean((0, 1))).sum()
        if self.cfg.router_z_coef:
            loss = loss + self.cfg.router_z_coef * torch.logsumexp(extra["logits"], dim=-1).square().mean()
        return loss

    def step_statistics(self, extra) -> dict[str, torch.Tensor]:
        """Per recursion: the fraction of tokens it updated, the mean update scale g over them, and
        (expert choice) how often threshold routing agrees with the routes taken (0 beyond N)."""
        keys = ("routed_frac", "router_g") + (("router_agree",) if self.cfg.routing == "expert" else ())
        if extra is None:
            return dict.fromkeys(keys, torch.zeros(()))
        sel = extra["sel"].detach()
        n = sel.sum().clamp(min=1)
        g = self.cfg.router_alpha * torch.sigmoid(extra["z"].detach()) if "z" in extra else extra["g"].detach()
        out = {"routed_frac": sel.float().mean(), "router_g": (g * sel).sum() / n}
        if "z" in extra:
            cand = extra["cand"]
            out["router_agree"] = (((extra["z"].detach() > 0) == sel) & cand).sum() / cand.sum().clamp(min=1)
        return out

    def make_cache(self, strategy: str = "full", r: int | None = None, max_len: int | None = None,
                   fixed: bool = False, store=None) -> KVCache:
        """Recursion-wise caching (`full`) or the first recursion's K/V shared by every recursion
        (`first`); per step the core blocks' stores and one route store (module docstring);
        otherwise as LoopedLM's. `last` and `average` would mix the routes of different steps."""
        if strategy not in ("full", "first"):
            raise ValueError(f"Mixture-of-Recursions caches recursion-wise ('full') or shares the first "
                             f"recursion's K/V ('first'), not {strategy!r}")
        return self._cache(self.cfg.n_rec + 1, strategy, r, max_len, fixed, store)
