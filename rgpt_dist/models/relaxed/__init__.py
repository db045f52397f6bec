"""Relaxed Recursive Transformer (SPEC section 4): config.py (RelaxedConfig), model.py
(RelaxedRecursiveGPT, its per-step LoRA). Trained in the three isoFLOPs cells of Table 1."""
from __future__ import annotations

from typing import Any

from rgpt_dist.models.flavours import CELLS, DEBUG_WIDTH, looped
from rgpt_dist.depth import FixedDepth
from rgpt_dist.models.relaxed.config import RelaxedConfig
from rgpt_dist.models.spec import LoopedSpec

ISOFLOPS = [cell for cell in CELLS if cell.endswith("isoflops")]


class RelaxedSpec(LoopedSpec):
    name = "relaxed"
    title = "RRT"
    table1_row = 4
    config = RelaxedConfig
    model = "rgpt_dist.models.relaxed.model:RelaxedRecursiveGPT"
    hf_writer = "rgpt_dist.export.hf_looped_writer:write_hf_looped"
    flavours = {**{f"rrt-{cell}": looped("relaxed", cell) for cell in ISOFLOPS},
                "rrt-debug": {"family": "relaxed", **DEBUG_WIDTH, "n_pre": 1, "n_rec": 1, "n_loops": 2, "n_coda": 1,
                              "lora_rank": 8, "lora_alpha": 8.0}}
    dense_reference = {**{f"rrt-{cell}": CELLS[cell][1] for cell in ISOFLOPS}, "rrt-debug": "gpt2-debug"}
    # Table 1 prints the cell's Params "+LoRA": the adapters are not in its number
    paper_table1 = {"rrt-small-isoflops": (36e6, 1.84e9), "rrt-medium-isoflops": (124e6, 7.35e9),
                    "rrt-large-isoflops": (288e6, 21.1e9)}
    paper_val_loss = {"rrt-small-isoflops": 3.14, "rrt-medium-isoflops": 2.95, "rrt-large-isoflops": 2.85}
    paper_params_note = "+LoRA"

    def depth_sampler(self, cfg: Any):
        """Depth-fixed: always R."""
        return FixedDepth(cfg.n_loops)

    def max_eval_depth(self, cfg: Any) -> int:
        return cfg.n_loops

    def width_overrides(self, d_model: int) -> dict[str, Any]:
        """The LoRA rank keeps its ratio to the width (64 at d = 768: d / 12), alpha / rank = 1."""
        rank = max(1, d_model // 12)
        return {"lora_rank": rank, "lora_alpha": float(rank)}

    def _lora_per_block_step(self, cfg: Any) -> int:
        """A (rank x in) + B (out x rank) on qkv (d -> 3d), attention out (d -> d), fc (d -> 4d) and
        the MLP out (4d -> d): rank x 16 d."""
        return cfg.lora_rank * 16 * cfg.d_model

    def extra_params(self, cfg: Any) -> int:
        return cfg.n_loops * cfg.n_rec * self._lora_per_block_step(cfg)

    def step_params(self, cfg: Any) -> int:
        """0: each loop's LoRA is its own (n_loops x n_rec adapters, one set per step), not shared
        across steps, so it is N_once; the shared base blocks (n_rec) are N_rec."""
        return 0

    def param_breakdown(self, cfg: Any) -> dict[str, int]:
        return {"lora": self.extra_params(cfg)}

    def step_flops(self, cfg: Any, r: float | None = None) -> float:
        """Eq. 1 form, the adapters as the paper writes them (W x + B A x): 2 FLOPs per adapter
        parameter per token, 32 rank d per core block and step."""
        return (cfg.n_loops if r is None else r) * cfg.n_rec * 2.0 * self._lora_per_block_step(cfg)

    def executed_step_flops(self, cfg: Any, r: float | None = None) -> float:
        """None per token: the implementation merges each update into its weight (model.py)."""
        return 0.0

    def executed_overhead_flops(self, cfg: Any, r: float | None = None) -> float:
        """Forming W + s B A once per forward: 2 rank (out x in) per projection, 24 rank d^2 per core
        block and step."""
        return (cfg.n_loops if r is None else r) * cfg.n_rec * 24.0 * cfg.lora_rank * cfg.d_model ** 2


SPEC = RelaxedSpec()
__all__ = ["SPEC", "RelaxedConfig"]
