"""Mixture-of-Recursions' model section (torch-free)."""
from __future__ import annotations

import dataclasses

from rgpt_dist.config.base import out_of_bounds
from rgpt_dist.config.model import LoopedConfig

ROUTING = ("expert", "token")
INFERENCE_ROUTING = ("threshold", "top_k")


@dataclasses.dataclass
class MoRConfig(LoopedConfig):
    """Mixture-of-Recursions (Bae et al. 2025; SPEC section 4) with expert-choice routing, in the
    prelude / shared core / coda layout of each Table 1 cell: the core is one recursion, applied up
    to N = n_loops times; before recursion i (0-based) a router keeps the ceil(c_i T) tokens of each
    sequence with the highest scores among those kept at i - 1, c_i = (N - i) / N, and only they are
    updated (h + g (core(h) - h), g = router_alpha * sigmoid(score)). An auxiliary BCE loss teaches
    the router to say alone (sigmoid > 1/2) which tokens top-k would keep, so that inference can
    route causally. Depth-fixed in training (always N); evaluated at depths 0..N."""

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
    tokens' scores: for diagnostics, without a cache)."""

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">", 0, router_alpha=self.router_alpha)
        out += out_of_bounds(path, "<=", 10, router_alpha=self.router_alpha)
        out += out_of_bounds(path, ">=", 0, router_aux_coef=self.router_aux_coef)
        out += out_of_bounds(path, "<=", 10, router_aux_coef=self.router_aux_coef)
        if self.routing not in ROUTING:
            out.append(f"{path}.routing={self.routing!r} must be one of {ROUTING}")
        if self.inference_routing not in INFERENCE_ROUTING:
            out.append(f"{path}.inference_routing={self.inference_routing!r} must be one of {INFERENCE_ROUTING}")
        return out
