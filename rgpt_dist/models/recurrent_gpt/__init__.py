"""RecurrentGPT (SPEC section 1): config.py (RecurrentGPTConfig), model.py (RecurrentGPT); the
Hugging Face export ships this model's own modules as remote code (rgpt_dist.export.hf_looped_writer)."""
from __future__ import annotations

from typing import Any

from rgpt_dist.models.flavours import CELLS, DEBUG_WIDTH, looped
from rgpt_dist.depth import make_sampler
from rgpt_dist.models.recurrent_gpt.config import RecurrentGPTConfig
from rgpt_dist.models.spec import LoopedSpec


class RecurrentGPTSpec(LoopedSpec):
    name = "recurrent_gpt"
    title = "RecurrentGPT"
    table1_row = 5
    config = RecurrentGPTConfig
    model = "rgpt_dist.models.recurrent_gpt.model:RecurrentGPT"
    hf_writer = "rgpt_dist.export.hf_looped_writer:write_hf_looped"
    diagnostics = True
    # CPU-sized debug: 1+1x2+1 executes 4 blocks per token, like the 4-layer dense debug model.
    flavours = {**{f"recurrentgpt-{cell}": looped("recurrent_gpt", cell) for cell in CELLS},
                "recurrentgpt-debug": {"family": "recurrent_gpt", **DEBUG_WIDTH, "n_pre": 1, "n_rec": 1,
                                       "n_loops": 2, "n_coda": 1}}
    dense_reference = {**{f"recurrentgpt-{cell}": dense for cell, (_, dense) in CELLS.items()},
                       "recurrentgpt-debug": "gpt2-debug"}
    paper_table1 = {
        "recurrentgpt-small-isoflops": (36e6, 1.84e9),
        "recurrentgpt-medium-isoflops": (124e6, 7.35e9),
        "recurrentgpt-large-isoflops": (288e6, 21.1e9),
        "recurrentgpt-medium-isoparams": (354e6, 26.4e9),
        "recurrentgpt-large-isoparams": (774e6, 109.0e9),
    }
    paper_val_loss = {"recurrentgpt-small-isoflops": 3.14, "recurrentgpt-medium-isoflops": 2.89,
                      "recurrentgpt-large-isoflops": 2.77, "recurrentgpt-medium-isoparams": 2.76,
                      "recurrentgpt-large-isoparams": 2.65}

    def depth_sampler(self, cfg: Any):
        """Uniform{r_min..R} per optimizer step (paper section 3.4) or per micro-batch, or always R."""
        return make_sampler(cfg.depth_sampler, cfg.r_min, cfg.n_loops, cfg.depth_per == "micro_batch")

    def extra_params(self, cfg: Any) -> int:
        """W_proj 2d^2 (no bias; d^2 for injection=state, 0 for none), gate MLP 2d^2 + d + d^2 + d
        and two gate LayerNorms (none for gate=none), and LayerScale's two gains of d per core block
        (layerscale > 0 only)."""
        d = cfg.d_model
        proj = {"concat": 2, "state": 1, "none": 0}[cfg.injection] * d * d
        norm = 2 * d if cfg.bias and cfg.norm == "layernorm" else d  # RMSNorm: a gain only
        gate = (3 * d * d + 2 * d) + 2 * norm if cfg.gate == "learned" else 0
        layerscale = 2 * d * cfg.n_rec if getattr(cfg, "layerscale", 0.0) > 0 else 0  # 0: before the field
        return proj + gate + layerscale

    def step_params(self, cfg: Any) -> int:
        """All of `extra_params`: W_proj, the gate MLP and its two norms (and the core's LayerScale
        gains) live in the recurrence module and run at every step with the same weights (the h_pre
        halves' products are computed once per forward, but the weights act on every step's
        input): N_rec beside the n_rec core blocks."""
        return self.extra_params(cfg)

    @staticmethod
    def _per_step_d2(cfg: Any) -> tuple[int, int, int]:
        """(Eq. 1 FLOPs per step, executed per step, executed once per forward), in units of d^2:
        W_proj 4 (2 executed per step, 2 once: the h_pre half), W_h alone 2, the gate 6 (4 per
        step, 2 once: its LN(h_pre) half)."""
        gated = cfg.gate == "learned"
        eq1 = {"concat": 4, "state": 2, "none": 0}[cfg.injection] + (6 if gated else 0)
        per_step = (2 if cfg.injection != "none" else 0) + (4 if gated else 0)
        once = (2 if cfg.injection == "concat" else 0) + (2 if gated else 0)
        return eq1, per_step, once

    def step_flops(self, cfg: Any, r: float | None = None) -> float:
        """Eq. 1: W_proj (2d -> d) and the gate (2d -> d -> d) cost 10 d^2 per step (less for the
        ablations' switches)."""
        return (cfg.n_loops if r is None else r) * self._per_step_d2(cfg)[0] * cfg.d_model ** 2

    def executed_step_flops(self, cfg: Any, r: float | None = None) -> float:
        """The h_pre halves of W_proj and of the gate's first layer run once per forward, not per
        step: r * 6 d^2 + 4 d^2 for the full model (equal to Eq. 1 at r = 1)."""
        r = cfg.n_loops if r is None else r
        _, per_step, once = self._per_step_d2(cfg)
        return (r * per_step + once) * cfg.d_model ** 2 if r > 0 else 0.0


SPEC = RecurrentGPTSpec()
__all__ = ["SPEC", "RecurrentGPTConfig"]
