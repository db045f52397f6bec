"""Ouro's model section (torch-free)."""
from __future__ import annotations

import dataclasses

from rgpt_dist.config.base import out_of_bounds
from rgpt_dist.config.model import LoopedConfig


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

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">=", 0, entropy_beta=self.entropy_beta)
        out += out_of_bounds(path, "<=", 10, entropy_beta=self.entropy_beta)
        out += out_of_bounds(path, ">", 0, exit_threshold=self.exit_threshold)
        out += out_of_bounds(path, "<=", 1, exit_threshold=self.exit_threshold)
        out += out_of_bounds(path, ">=", -100, exit_bias_init=self.exit_bias_init)
        out += out_of_bounds(path, "<=", 100, exit_bias_init=self.exit_bias_init)
        return out
