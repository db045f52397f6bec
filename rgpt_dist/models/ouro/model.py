"""Ouro (Zhu et al. 2025; SPEC section 4) on the shared prelude/core/coda skeleton
(rgpt_dist.models.looped): the core is looped on its own output and every iteration is read out.

    h_pre   = prelude(wte(idx) + wpe(pos))                    (B, T, d)
    s^(0)   = h_pre
    step t  = 1..r:  s^(t) = core(s^(t-1))                    n_rec shared blocks: no injection, no gate
                     (loop_norm: s^(t) = N(core(s^(t-1))), Ouro's per-loop norm)
    exit t:  c_t = coda(s^(t));  logits_t = head(c_t)         the shared readout, (B, T, V)
             lambda_t = sigmoid(w . LN(c_t) + b),  lambda_r = 1   the exit gate, (B, T)
             (gate_input=state: w . LN(s^(t)) + b; with loop_norm w . s^(t) + b, Ouro's gate)
    p(t)    = lambda_t prod_{j<t} (1 - lambda_j)              per token; p(r) is the remaining mass
    J       = mean over tokens of  sum_t p(t) CE_t - beta H(p),   H(p) = -sum_t p(t) log p(t)

Training (targets and no cache) reads out every iteration: it returns loss = CE_r, the final exit
(what every family logs and is compared on), and aux['aux_loss'] = J - CE_r, so that the trainer's
loss + aux_loss is J; aux['stats'] holds per iteration the mean exit probability, the mean gate and
the loss. Every "mean over tokens" is the factory's `loss_weights` (train.loss_norm example: the mean
over examples of each one's token mean, as the LM head's loss). Evaluation and decoding at a fixed
depth r are the skeleton's (one readout, the KV cache exact). `exit_at_threshold` evaluates the
per-token exit of Ouro's inference: a token leaves at the first iteration whose cumulative exit
probability reaches q.

stage=gate (Ouro's stage II, Zhu et al. 2025 section 3.4): every parameter but the exit gate's is
frozen (requires_grad False) and the objective is the adaptive exit loss, per token
    I_t = max(0, CE_{t-1} - CE_t) (detached),  w_t = sigmoid(k (I_t - gamma))
    J_gate = mean over t = 2..r of the token mean of  -[w_t log(1 - lambda_t) + (1 - w_t) log lambda_t]
(lambda_r from the gate too: the loss trains it at every t >= 2); loss = CE_r as above.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from rgpt_dist.models.kv_cache import LayerCache
from rgpt_dist.models.layers import Block, LayerFactory, ModelOutput, layer_norm
from rgpt_dist.models.looped import LoopedLM
from rgpt_dist.models.ouro.config import OuroConfig
from rgpt_dist.noise import NoiseKey


class LoopedCore(nn.Module):
    """One iteration: s_next = core(s), the n_rec shared blocks on the previous state alone."""

    def __init__(self, cfg: OuroConfig, factory: LayerFactory, out_std: float):
        super().__init__()
        self.blocks = nn.ModuleList(Block(cfg, factory, out_std) for _ in range(cfg.n_rec))
        # Ouro's per-loop norm (loop_norm): replicated under tensor parallelism, like every norm
        self.loop_norm = layer_norm(cfg) if cfg.loop_norm else None

    def forward(self, s: torch.Tensor, anchor: None, i: int, key: NoiseKey | None,
                caches: list[LayerCache] | None = None, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """s: (B, T, d); anchor, key: unused (no injection, no noise); caches: this step's K/V
        cache of each core block, or None; mask: for padded batches."""
        for block, cache in zip(self.blocks, caches or [None] * len(self.blocks)):
            s = block(s, cache, None, mask)
        return (s if self.loop_norm is None else self.loop_norm(s)), None


class ExitGate(nn.Module):
    """lambda_t's logit w . LN(x) + b: (B, T, d) -> (B, T) in fp32 (or wider); x is the coda's output
    c_t or (gate_input=state) the state s^(t), which with loop_norm is normed already: then no LN
    (Ouro's gate). Replicated under tensor parallelism (its input is)."""

    def __init__(self, cfg: OuroConfig, factory: LayerFactory):
        super().__init__()
        self.ln = nn.Identity() if cfg.gate_input == "state" and cfg.loop_norm else layer_norm(cfg)
        self.proj = factory.linear(cfg.d_model, 1, bias=True, parallel="none", init_std=cfg.init_std)
        with torch.no_grad():
            self.proj.bias.fill_(cfg.exit_bias_init)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        z = self.proj(self.ln(c)).squeeze(-1)
        return z.to(torch.promote_types(z.dtype, torch.float32))


class ExitReadout(nn.Module):
    """One iteration's exit in training: coda, shared head, per-token loss and exit gate. A unit of
    its own so that activation checkpointing recomputes it in backward instead of holding r sets of
    (B, T, V) logits. The coda and head are the skeleton's (owned and named there, not here)."""

    def __init__(self, cfg: OuroConfig, factory: LayerFactory, coda: nn.ModuleList, head: nn.Module):
        super().__init__()
        self.gate = ExitGate(cfg, factory)
        self.factory, self.vocab_size = factory, cfg.vocab_size
        self.gate_reads_state = cfg.gate_input == "state"
        self._readout = [coda, head]  # a list: not registered (and counted) twice

    def forward(self, s: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None,
                with_gate: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """s: (B, T, d) -> (logits (B, T, V), per-token loss (B, T), gate logit (B, T) or None)."""
        coda, head = self._readout
        c = s
        for block in coda:
            c = block(c, None, None, mask)
        logits, _ = head(c, None)
        losses = self.factory.token_losses(logits, targets, self.vocab_size)
        return logits, losses, self.gate(s if self.gate_reads_state else c) if with_gate else None


def exit_log_probs(gate_logits: torch.Tensor) -> torch.Tensor:
    """(r - 1, B, T) logits of lambda_1..lambda_{r-1} -> (r, B, T) log p(t), in log space:
    log p(t) = log lambda_t + sum_{j<t} log(1 - lambda_j), with lambda_r = 1."""
    zero = gate_logits.new_zeros((1, *gate_logits.shape[1:]))
    stay = torch.cat([zero, F.logsigmoid(-gate_logits).cumsum(0)])          # sum_{j<t} log(1 - lambda_j)
    return stay + torch.cat([F.logsigmoid(gate_logits), zero])               # + log lambda_t


def gate_stage_loss(gate_logits: torch.Tensor, losses: torch.Tensor, k: float, gamma: float) -> torch.Tensor:
    """Ouro's stage-II adaptive exit loss per token (B, T), from (r, B, T) gate logits of
    lambda_1..lambda_r and per-token losses: (1 / r) x the sum over t = 2..r (Ouro's normalisation,
    1 / T_max) of the binary cross-entropy between the continue probability 1 - lambda_t and
    w_t = sigmoid(k (I_t - gamma)), I_t = max(0, CE_{t-1} - CE_t), the losses detached (the gate is
    trained, not the model)."""
    losses = losses.detach()
    w = torch.sigmoid(k * ((losses[:-1] - losses[1:]).clamp(min=0) - gamma))        # (r - 1, B, T)
    z = gate_logits[1:]                                                                # lambda_2..lambda_r
    bce = -(w * F.logsigmoid(-z) + (1 - w) * F.logsigmoid(z))                          # log(1 - lambda), log lambda
    return bce.sum(0) / gate_logits.shape[0]


class OuroGPT(LoopedLM):
    def __init__(self, cfg: OuroConfig, factory: LayerFactory | None = None):
        factory = factory or LayerFactory()
        super().__init__(cfg, factory, lambda factory, out_std: LoopedCore(cfg, factory, out_std))
        # created after the skeleton, so that a seed initialises the shared modules as in every family
        self.exits = ExitReadout(cfg, factory, self.coda, self.head)
        if cfg.stage == "gate":  # Ouro's stage II: the optimizer (params with requires_grad) holds the gate only
            for name, p in self.named_parameters():
                p.requires_grad_(name.startswith("exits.gate."))

    def start(self, h_pre: torch.Tensor, r: int, noise_key: NoiseKey | None, past: int, positions=None):
        return h_pre, None

    def checkpoint_units(self, mode: str) -> list[nn.Module]:
        """The skeleton's units and the training readout of every iteration."""
        return super().checkpoint_units(mode) + [self.exits]

    def _iterate(self, idx: torch.Tensor, targets: torch.Tensor, r: int, mask, positions, gate_last: bool = False):
        """Every iteration's readout: (logits at r, losses (r, B, T), gate logits (r - 1, B, T), or
        (r, B, T) with gate_last)."""
        s = self.embed(idx, 0, positions)
        for block in self.prelude:
            s = block(s, None, None, mask)
        losses, gates = [], []
        for t in range(r):
            s, _ = self.recurrence(s, None, t, None, None, mask)
            logits, loss_t, gate_t = self.exits(s, targets, mask, t < r - 1 or gate_last)
            losses.append(loss_t)
            if gate_t is not None:
                gates.append(gate_t)
        empty = losses[0].new_zeros((0, *losses[0].shape))
        return logits, torch.stack(losses), torch.stack(gates) if gates else empty

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, r: int | None = None,
                all_exits: bool = False, noise_key: NoiseKey | None = None, cache=None, stats: bool = False,
                mask: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> ModelOutput:
        """As LoopedLM.forward; in training with targets and no cache, the objective J above."""
        if not self.training or targets is None or cache is not None or all_exits:
            return super().forward(idx, targets, r, all_exits, noise_key, cache, stats, mask, positions)
        r = self.cfg.n_loops if r is None else int(r)
        gate_stage = self.cfg.stage == "gate"
        if r < 1 + gate_stage:
            raise ValueError(f"Ouro trains at depth r >= {1 + gate_stage} (every iteration is an exit"
                             f"{'; the gate stage compares consecutive ones' if gate_stage else ''}), got r={r}")
        logits, losses, all_gates = self._iterate(idx, targets, r, mask, positions, gate_last=gate_stage)
        gate_logits = all_gates[:r - 1]                                        # lambda_1..lambda_{r-1}
        log_p = exit_log_probs(gate_logits)                                    # (r, B, T)
        p = log_p.exp()
        valid, n = self.exits.factory.loss_weights(targets, losses.dtype)  # train.loss_norm's (B, T), ()
        if gate_stage:
            objective = (gate_stage_loss(all_gates, losses, self.cfg.gate_k, self.cfg.gate_gamma) * valid).sum() / n
        else:
            entropy = -(p * log_p).sum(0)                                      # (B, T)
            objective = (((p * losses).sum(0) - self.cfg.entropy_beta * entropy) * valid).sum() / n
        loss = (losses[-1] * valid).sum() / n                                  # CE_r, as every family logs
        lambdas = torch.cat([torch.sigmoid(gate_logits), torch.ones_like(p[:1])])   # lambda_r = 1

        def per_iteration(x: torch.Tensor) -> torch.Tensor:                 # (r, B, T) -> (r,) token mean
            return (x * valid).sum((1, 2)).detach() / n
        aux = {"depth": r, "aux_loss": objective - loss,
               "stats": {"exit_prob": per_iteration(p), "exit_lambda": per_iteration(lambdas),
                         "step_loss": per_iteration(losses)}}
        return ModelOutput(loss=loss, logits=logits, aux=aux)

    def exit_at_threshold(self, idx: torch.Tensor, targets: torch.Tensor, q: float,
                          r: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Ouro's per-token exit at one threshold q: exits_at_thresholds(idx, targets, [q], r)[0]."""
        return self.exits_at_thresholds(idx, targets, [q], r)[0]

    @torch.no_grad()
    def exits_at_thresholds(self, idx: torch.Tensor, targets: torch.Tensor, thresholds: list[float],
                            r: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Ouro's per-token exit: each token leaves at the first iteration t whose cumulative exit
        probability sum_{j<=t} p(j) reaches q (at r if none does). Per q, (its depth t (B, T) in
        1..r, its loss there (B, T)), from one pass through the iterations. Every iteration is
        computed for every token, so the context a token attends to is the full-depth one (what a
        KV cache holding each token's last computed K/V approximates); the compute the exits spend
        is counted by the spec."""
        r = self.cfg.n_loops if r is None else int(r)
        if r < 1 or not all(0 < q <= 1 for q in thresholds):
            raise ValueError(f"exit thresholds need r >= 1 and 0 < q <= 1, got r={r}, q={list(thresholds)}")
        _, losses, gate_logits = self._iterate(idx, targets, r, None, None)
        cdf = exit_log_probs(gate_logits).exp().cumsum(0)                     # (r, B, T)
        out = []
        for q in thresholds:
            reached = cdf >= q
            reached[-1] = True                                                 # all the mass has left by r
            first = reached.float().argmax(0)                                  # (B, T): first True
            out.append((first + 1, losses.gather(0, first[None]).squeeze(0)))
        return out
