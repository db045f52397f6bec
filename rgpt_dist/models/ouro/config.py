"""Ouro's model section (torch-free)."""
from __future__ import annotations

import dataclasses
from typing import Literal

from rgpt_dist.sections import out_of_bounds
from rgpt_dist.models.config import LoopedConfig


@dataclasses.dataclass
class OuroConfig(LoopedConfig):
    """Ouro (Zhu et al. 2025; SPEC section 4) in the prelude / shared core / coda layout of each
    Table 1 cell: the core looped R times on its own output (no injection, no gate), every
    iteration read out through the coda and the shared head, and a learned exit distribution
    over the iterations trained with an entropy-regularised expected loss. Depth-fixed in
    training (always R); evaluated at any depth, or per token at an exit threshold q."""

    family: str = "ouro"
    """Model family (fixed for this class)."""
    entropy_beta: float = 0.1
    """beta of the objective sum_t p(t) L_t - beta H(p): the weight of the exit distribution's
    entropy, which keeps it from collapsing onto one iteration (the RecurrentGPT paper states no
    value; 0.1 is ours); 0 <= entropy_beta <= 10."""
    exit_bias_init: float = 0.0
    """Initial bias of the exit gate lambda_t = sigmoid(w . LN(c_t) + b); 0 starts every
    iteration at lambda = 0.5 (exit mass 1/2, 1/4, ..., the rest at R); -100 <= exit_bias_init <= 100."""
    exit_threshold: float = 0.5
    """q: at inference with per-token exit, a token exits at the first iteration t whose
    cumulative exit probability sum_{j<=t} p(j) reaches q (the last iteration otherwise);
    0 < exit_threshold <= 1. Fixed-depth forwards (training, generation at r) ignore it."""
    loop_norm: bool = False
    """Ouro's per-loop state norm: its released modelling code (modeling_ouro.py, OuroModel.forward)
    applies its final RMSNorm after every pass through the stack and feeds that normed state to the
    next pass, the head and the exit gate. True: s^(t) = N(core(s^(t-1))), N a norm of `norm`'s kind
    of the step's own (`recurrence.loop_norm`; here the coda and the head's final norm sit between
    the loop and the head, so the head's norm cannot double as it). False (default): no norm
    between iterations, as before."""
    gate_input: Literal["coda", "state"] = "coda"
    """What the exit gate reads at iteration t. coda (default): lambda_t = sigmoid(w . LN_g(c_t) + b),
    the coda's output through the gate's own norm; state: the loop's state s^(t), as Ouro's gate
    (a plain linear layer on the normed state its next loop and head read): with loop_norm,
    w . s^(t) + b (the state is normed already, the gate has no norm of its own, Ouro exactly);
    without it w . LN_g(s^(t)) + b. One of the two."""
    stage: Literal["joint", "gate"] = "joint"
    """Training stage. joint (default): every parameter trains on the entropy-regularised objective
    (Ouro's stage I). gate: Ouro's stage II, only the exit gate trains (every other parameter has
    requires_grad False, so the optimizer holds the gate alone) on the adaptive exit loss: per
    token and iteration t = 2..R, BCE between the continue probability 1 - lambda_t and the target
    w_t = sigmoid(gate_k (I_t - gate_gamma)), I_t = max(0, CE_{t-1} - CE_t) (detached); needs
    n_loops >= 2. One of the two."""
    gate_k: float = 50.0
    """k of the stage-II target's slope w_t = sigmoid(k (I_t - gamma)) (Ouro: 50); 0 < gate_k <= 1000."""
    gate_gamma: float = 0.005
    """gamma, the loss improvement (nats) above which continuing is the stage-II target (Ouro:
    0.005); 0 <= gate_gamma <= 10."""

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">=", 0, entropy_beta=self.entropy_beta)
        out += out_of_bounds(path, "<=", 10, entropy_beta=self.entropy_beta)
        out += out_of_bounds(path, ">", 0, exit_threshold=self.exit_threshold)
        out += out_of_bounds(path, "<=", 1, exit_threshold=self.exit_threshold)
        out += out_of_bounds(path, ">=", -100, exit_bias_init=self.exit_bias_init)
        out += out_of_bounds(path, "<=", 100, exit_bias_init=self.exit_bias_init)
        out += out_of_bounds(path, ">", 0, gate_k=self.gate_k) + out_of_bounds(path, "<=", 1000, gate_k=self.gate_k)
        out += out_of_bounds(path, ">=", 0, gate_gamma=self.gate_gamma)
        out += out_of_bounds(path, "<=", 10, gate_gamma=self.gate_gamma)
        if self.stage == "gate" and self.n_loops < 2:
            out.append(f"{path}.n_loops={self.n_loops} with {path}.stage='gate': the gate stage needs n_loops >= 2 "
                       f"(its loss compares each iteration with the one before)")
        return out
