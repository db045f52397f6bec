"""Heavy-tail Poisson depth (Huginn-style; SPEC section 4): config.py (PoissonConfig), sampler.py
(the Poisson-lognormal depth), model.py (PoissonDepthGPT). Trained in every Table 1 cell."""
from __future__ import annotations

from typing import Any

from rgpt_dist.models.flavours import CELLS, DEBUG_WIDTH, looped
from rgpt_dist.depth import FixedDepth
from rgpt_dist.models.poisson.config import PoissonConfig
from rgpt_dist.models.spec import LoopedSpec


class PoissonSpec(LoopedSpec):
    name = "poisson"
    title = "Heavy-tail Poisson"
    table1_row = 2
    config = PoissonConfig
    model = "rgpt_dist.models.poisson.model:PoissonDepthGPT"
    hf_writer = "rgpt_dist.export.hf_looped_writer:write_hf_looped"
    flavours = {**{f"poisson-{cell}": looped("poisson", cell) for cell in CELLS},
                "poisson-debug": {"family": "poisson", **DEBUG_WIDTH, "n_pre": 1, "n_rec": 1, "n_loops": 2,
                                  "n_coda": 1, "k_max": 2}}
    dense_reference = {**{f"poisson-{cell}": dense for cell, (_, dense) in CELLS.items()}, "poisson-debug": "gpt2-debug"}
    # Table 1 prints the same Params and FLOPs/fwd for every method of a cell
    paper_table1 = {"poisson-small-isoflops": (36e6, 1.84e9), "poisson-medium-isoflops": (124e6, 7.35e9),
                    "poisson-large-isoflops": (288e6, 21.1e9), "poisson-medium-isoparams": (354e6, 26.4e9),
                    "poisson-large-isoparams": (774e6, 109.0e9)}
    paper_val_loss = {"poisson-small-isoflops": 3.23, "poisson-medium-isoflops": 2.97, "poisson-large-isoflops": 2.93,
                      "poisson-medium-isoparams": 2.74, "poisson-large-isoparams": 2.70}

    def depth_sampler(self, cfg: Any):
        """Poisson-lognormal with mean E[r] per optimizer step, or always n_loops (depth_sampler=fixed)."""
        # the sampler needs numpy: the family registry, and the GPU suite, load without it
        from rgpt_dist.models.poisson.sampler import PoissonLogNormalDepth

        if cfg.depth_sampler == "fixed":
            return FixedDepth(cfg.n_loops)
        return PoissonLogNormalDepth(cfg.train_mean_depth, cfg.depth_sigma)

    def extra_params(self, cfg: Any) -> int:
        """The adapter [s, e] -> d: 2 d^2, no bias."""
        return 2 * cfg.d_model ** 2

    def step_params(self, cfg: Any) -> int:
        """The adapter (all of `extra_params`): W [s; e] runs at every step with the same weights, the
        injection SPEC section 10 counts in N_rec (its 2 d^2)."""
        return self.extra_params(cfg)

    def step_flops(self, cfg: Any, r: float | None = None) -> float:
        """Eq. 1 form: the adapter (2d -> d) costs 4 d^2 per step."""
        return (cfg.n_loops if r is None else r) * 4.0 * cfg.d_model ** 2

    def executed_step_flops(self, cfg: Any, r: float | None = None) -> float:
        """W_e e runs once per forward: r * 2 d^2 + 2 d^2."""
        r = cfg.n_loops if r is None else r
        return (r * 2.0 + 2.0) * cfg.d_model ** 2 if r > 0 else 0.0

    def grad_steps(self, cfg: Any, r: float) -> float:
        """Truncated backprop: the last min(r, k) steps (k: cfg.grad_depth, from k_max or k_frac)."""
        return min(r, cfg.grad_depth)


SPEC = PoissonSpec()
__all__ = ["SPEC", "PoissonConfig"]
