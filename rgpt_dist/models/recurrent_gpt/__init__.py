"""RecurrentGPT (SPEC section 1): config.py (RecurrentGPTConfig), model.py (RecurrentGPT); the
Hugging Face export ships this model's own modules as remote code (rgpt_dist.export.hf_looped_writer)."""
from __future__ import annotations

from typing import Any

from rgpt_dist.config.flavours import CELLS, DEBUG_WIDTH, looped
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
        """Uniform{r_min..R} per optimizer step (paper section 3.4), or always R."""
        return make_sampler(cfg.depth_sampler, cfg.r_min, cfg.n_loops)

    def extra_params(self, cfg: Any) -> int:
        """W_proj 2d^2 (no bias), gate MLP 2d^2 + d + d^2 + d, two gate LayerNorms."""
        d = cfg.d_model
        return 2 * d * d + (3 * d * d + 2 * d) + (4 * d if cfg.bias else 2 * d)

    def step_flops(self, cfg: Any, r: float | None = None) -> float:
        """Eq. 1: W_proj (2d -> d) and the gate (2d -> d -> d) cost 10 d^2 per step."""
        return (cfg.n_loops if r is None else r) * 10.0 * cfg.d_model ** 2

    def executed_step_flops(self, cfg: Any, r: float | None = None) -> float:
        """The h_pre halves of W_proj and of the gate's first layer run once per forward, not per
        step: r * 6 d^2 + 4 d^2 (equal to Eq. 1 at r = 1)."""
        r = cfg.n_loops if r is None else r
        return (r * 6.0 + 4.0) * cfg.d_model ** 2 if r > 0 else 0.0


SPEC = RecurrentGPTSpec()
__all__ = ["SPEC", "RecurrentGPTConfig"]
