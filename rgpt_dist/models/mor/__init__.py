"""Mixture-of-Recursions (Bae et al. 2025; SPEC section 4): config.py (MoRConfig), model.py
(MixtureOfRecursionsGPT, its router and routed recursion). Trained in every Table 1 cell."""
from __future__ import annotations

import math
from typing import Any

from rgpt_dist.models.flavours import CELLS, DEBUG_WIDTH, looped
from rgpt_dist.depth import FixedDepth
from rgpt_dist.models.mor.config import MoRConfig
from rgpt_dist.models.spec import LoopedSpec


class MoRSpec(LoopedSpec):
    name = "mor"
    title = "MoR"
    table1_row = 1
    config = MoRConfig
    model = "rgpt_dist.models.mor.model:MixtureOfRecursionsGPT"
    hf_writer = "rgpt_dist.export.hf_looped_writer:write_hf_looped"
    kv_strategies = ("full", "first")  # recursion-wise caching, recursive KV sharing
    # Bae et al. compare at equal training FLOPs: MoR, cheaper per token, trains on more tokens
    compute_matching = "tokens"
    flavours = {**{f"mor-{cell}": looped("mor", cell) for cell in CELLS},
                "mor-debug": {"family": "mor", **DEBUG_WIDTH, "n_pre": 1, "n_rec": 1, "n_loops": 3, "n_coda": 1}}
    dense_reference = {**{f"mor-{cell}": dense for cell, (_, dense) in CELLS.items()}, "mor-debug": "gpt2-debug"}
    # Table 1 prints the same Params and FLOPs/fwd for every method of a cell
    paper_table1 = {"mor-small-isoflops": (36e6, 1.84e9), "mor-medium-isoflops": (124e6, 7.35e9),
                    "mor-large-isoflops": (288e6, 21.1e9), "mor-medium-isoparams": (354e6, 26.4e9),
                    "mor-large-isoparams": (774e6, 109.0e9)}
    paper_val_loss = {"mor-small-isoflops": 3.30, "mor-medium-isoflops": 3.02, "mor-large-isoflops": 2.91,
                      "mor-medium-isoparams": 2.78, "mor-large-isoparams": 2.69}

    def depth_sampler(self, cfg: Any):
        """Depth-fixed: every recursion runs (at its capacity) in every step."""
        return FixedDepth(cfg.n_loops)

    def max_eval_depth(self, cfg: Any) -> int:
        return cfg.n_loops  # capacity 0 beyond N

    def extra_params(self, cfg: Any) -> int:
        """The router: one w_i (d) per recursion."""
        return cfg.n_loops * cfg.d_model

    def step_params(self, cfg: Any) -> int:
        """0: the router holds one w_i per recursion, each used at its own step only (token choice:
        the N logits once, before the recursions), so it is not shared across steps: N_once. Only
        the n_rec core blocks are N_rec (each run on a shrinking fraction of the tokens: the law's r
        counts recursions, not the tokens routed through them, a simplification)."""
        return 0

    @staticmethod
    def capacities(cfg: Any, r: float | None = None) -> list[float]:
        """c_i = (N - i) / N of the recursions a depth-r forward runs (r <= N)."""
        N = cfg.n_loops
        return [(N - i) / N for i in range(min(N, N if r is None else math.ceil(r)))]

    def block_executions(self, cfg: Any, r: float | None = None) -> float:
        """Per token: the prelude, the coda, and n_rec blocks for the fraction c_i of tokens each
        recursion keeps (Eq. 1 generalised to the routed token counts). Token choice runs every
        recursion on every token (masked), up to N."""
        if cfg.routing == "token":
            return float(cfg.n_pre + cfg.n_coda + cfg.n_rec * len(self.capacities(cfg, r)))
        return float(cfg.n_pre + cfg.n_coda + cfg.n_rec * sum(self.capacities(cfg, r)))

    def step_flops(self, cfg: Any, r: float | None = None) -> float:
        """Expert choice: the router's score per token and recursion, 2 d (w_i . h); token choice:
        its N depth logits once, 2 d N."""
        steps = len(self.capacities(cfg, r))
        if cfg.routing == "token":
            return 2.0 * cfg.d_model * cfg.n_loops if steps else 0.0
        return steps * 2.0 * cfg.d_model

    def executed_step_flops(self, cfg: Any, r: float | None = None) -> float:
        """What a matmul counter sees: nothing of expert choice's scores (an elementwise product
        and a sum), token choice's depth logits (a linear layer)."""
        return self.step_flops(cfg, r) if cfg.routing == "token" else 0.0

    def sequence_flops(self, cfg: Any, seq_len: int, r: float | None = None) -> float:
        """Expert choice: recursion i attends over its c_i S kept tokens, not S: 4 S d c_i (1 - c_i)
        per token less than block_executions' full-context attention (negative). Token choice: 0."""
        if cfg.routing == "token":
            return 0.0
        return -cfg.n_rec * sum(4.0 * seq_len * cfg.d_model * c * (1 - c) for c in self.capacities(cfg, r))

    def recompute_flops(self, cfg: Any, seq_len: int, r: float | None, mode: str) -> float:
        """`recurrence`: every recursion at its capacity (token choice: in full); `blocks`: also the
        prelude and coda."""
        if cfg.routing == "token":
            r = cfg.n_loops if r is None else min(r, cfg.n_loops)
            return super().recompute_flops(cfg, seq_len, r, mode)
        d = cfg.d_model
        flops = cfg.n_rec * sum(c * (24.0 * d * d + 4.0 * c * seq_len * d) for c in self.capacities(cfg, r))
        return flops + ((cfg.n_pre + cfg.n_coda) * (24.0 * d * d + 4.0 * seq_len * d) if mode == "blocks" else 0.0)


SPEC = MoRSpec()
__all__ = ["SPEC", "MoRConfig"]
