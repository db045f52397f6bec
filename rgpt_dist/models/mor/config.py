"""Mixture-of-Recursions' model section (torch-free)."""
from __future__ import annotations

import dataclasses

from rgpt_dist.sections import out_of_bounds
from rgpt_dist.models.config import LoopedConfig

ROUTING = ("expert", "token")
INFERENCE_ROUTING = ("threshold", "top_k")
UPDATES = ("delta", "residual")
GATE_AT = ("every", "exit")
# The MoR authors' token-choice setting as overrides (docs/families.md, MoR: sources of each value);
# e.g. load_config("mor-debug", list(AUTHORS_TOKEN_CHOICE))
AUTHORS_TOKEN_CHOICE = ("model.routing=token", "model.update=residual", "model.router_alpha=1.0",
                        "model.router_aux_coef=0.1", "model.router_z_coef=1e-5", "model.router_gate_at=exit")


@dataclasses.dataclass
class MoRConfig(LoopedConfig):
    """Mixture-of-Recursions (Bae et al. 2025; SPEC section 4) with expert-choice routing, in the
    prelude / shared core / coda layout of each Table 1 cell: the core is one recursion, applied up
    to N = n_loops times; before recursion i (0-based) a router keeps the ceil(c_i T) tokens of each
    sequence with the highest scores among those kept at i - 1, c_i = (N - i) / N, and only they are
    updated (h + g (core(h) - h), g = router_alpha * sigmoid(score); `update=residual`: h + g core(h)).
    An auxiliary BCE loss teaches the router to say alone (sigmoid > 1/2) which tokens top-k would
    keep, so that inference can route causally. Depth-fixed in training (always N); evaluated at depths 0..N."""

    family: str = "mor"
    """Model family (fixed for this class)."""
    routing: str = "expert"
    """`expert`: expert choice, each recursion keeps its capacity's best-scored tokens (MoR's
    default; the class docstring). `token`: token choice, a router over the N depths assigns each
    token its number of recursions once (top-1), with a balancing loss; causal in training too,
    computed on every token with the unselected masked (no FLOPs saved)."""
    router_alpha: float = 0.1
    """alpha: the selected tokens' update is scaled by alpha * sigmoid(w_i . h) (MoR's expert-choice
    default 0.1); 0 < router_alpha <= 10."""
    router_aux_coef: float = 0.001
    """Weight of the auxiliary loss. Expert choice: the sum over recursions of the mean binary
    cross-entropy between sigmoid(w_i . h) and whether top-k kept the token, over the tokens it
    chose from (MoR's 0.001). Token choice: the balancing loss N sum_j f_j P_j over the depths.
    0 <= router_aux_coef <= 10."""
    inference_routing: str = "threshold"
    """How evaluation and decoding route: `threshold` keeps a candidate token where
    sigmoid(w_i . h) > 1/2 (causal: a token's route depends on its own state only; KV caches work),
    `top_k` routes as training does (the capacity's top-k per sequence, which looks at future
    tokens' scores: for diagnostics, without a cache). Evaluation with every exit (the trainer's)
    also reports the other routing's loss and how often the two agree (model.py)."""
    update: str = "delta"
    """How a selected token's state x takes the core's output o = core(x), which includes x (each
    block adds its residual): `delta` (ours, default) x + g (o - x), the core's change scaled as
    Mixture-of-Depths does; `residual` (the MoR authors' code) x + g o, their scatter_add of the
    gated block output onto the state, so x is kept in full and the gate scales the whole output."""
    router_z_coef: float = 0.0
    """Weight of the router z-loss (MoR's code, after ST-MoE): expert choice, the sum over
    recursions of the mean over its candidates of z_i^2 (logsumexp over one logit); token choice,
    once, the mean over tokens of logsumexp_j(W h^(0))_j^2. Added to the auxiliary loss; 0 (ours,
    default) turns it off. 0 <= router_z_coef <= 1."""
    router_gate_at: str = "every"
    """Token choice only: where g = alpha p(depth) enters. `every` (ours, default): each of a
    token's recursions updates it by the `update` rule with g. `exit` (the MoR authors' code): the
    recursions before its last run ungated (h <- core(h)) and the last one combines the whole
    chain with the state before the first recursion, h^(0) + g (o - h^(0)) (`delta`) or
    h^(0) + g o (`residual`); an early exit (r < a token's depth) reads its ungated state."""

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">", 0, router_alpha=self.router_alpha)
        out += out_of_bounds(path, "<=", 10, router_alpha=self.router_alpha)
        out += out_of_bounds(path, ">=", 0, router_aux_coef=self.router_aux_coef)
        out += out_of_bounds(path, "<=", 10, router_aux_coef=self.router_aux_coef)
        if self.routing not in ROUTING:
            out.append(f"{path}.routing={self.routing!r} must be one of {ROUTING}")
        out += out_of_bounds(path, ">=", 0, router_z_coef=self.router_z_coef)
        out += out_of_bounds(path, "<=", 1, router_z_coef=self.router_z_coef)
        if self.update not in UPDATES:
            out.append(f"{path}.update={self.update!r} must be one of {UPDATES}")
        if self.router_gate_at not in GATE_AT:
            out.append(f"{path}.router_gate_at={self.router_gate_at!r} must be one of {GATE_AT}")
        elif self.router_gate_at == "exit" and self.routing != "token":
            out.append(f"{path}.router_gate_at='exit' needs routing='token' (expert choice gates every "
                       f"recursion it runs), not routing={self.routing!r}")
        if self.inference_routing not in INFERENCE_ROUTING:
            out.append(f"{path}.inference_routing={self.inference_routing!r} must be one of {INFERENCE_ROUTING}")
        return out
