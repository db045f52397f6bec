"""RecurrentGPT's model section (torch-free)."""
from __future__ import annotations

import dataclasses
from typing import Literal

from rgpt_dist.sections import out_of_bounds
from rgpt_dist.models.config import LoopedConfig


@dataclasses.dataclass
class RecurrentGPTConfig(LoopedConfig):
    """RecurrentGPT: n_pre prelude blocks, n_rec shared blocks applied r times through the gated
    projection (SPEC section 1), n_coda coda blocks, final LN, tied head."""

    family: str = "recurrent_gpt"
    """Model family (fixed for this class)."""
    r_min: int = 1
    """Smallest depth the training sampler draws (Uniform{r_min..R})."""
    depth_sampler: Literal["uniform", "fixed"] = "uniform"
    """Training depth schedule: uniform = Uniform{r_min..R} per optimizer step; fixed = always R."""
    depth_per: Literal["step", "micro_batch"] = "step"
    """How often the uniform sampler draws r: once per optimizer step (the paper's text, section
    3.4), or once per micro-batch (its Listing A samples inside forward); every rank draws the same
    r for its k-th micro-batch."""
    sigma_x: float = 0.1
    """Std of the state noise eps_x added to h^(r-1) before W_proj (training only)."""
    sigma_g: float = 0.1
    """Std of the per-scalar gate noise eps_g added to the gate logits (training only)."""
    tau: float = 1.0
    """Gate temperature: g = sigmoid(f_g(...) / tau + eps_g)."""
    gate_bias_init: float = 4.0
    """Initial bias b of the gate MLP's second layer, any finite value: g ~ sigmoid(b / tau) of the
    *old* state is kept at init (+4: 0.982). The silent-thinking paper's identity-biased gate
    z = sigmoid(W_z [h'; h] + b_z), h <- z h' + (1 - z) h, puts its bias on the *new* state: its
    b_z = -2 keeps 1 - sigmoid(-2) = sigmoid(2) = 0.881 of the old one, i.e. gate_bias_init = +2 here
    (at tau = 1). The inputs differ (model.py's module doc): this gate reads [LN(h^(i-1)), LN(h_pre)]
    through a 2-layer MLP, not [h'; h] through one linear map."""
    layerscale: float = 0.0
    """LayerScale (Touvron et al. 2021, the silent-thinking paper's recurrent block): 0 = off (no
    parameters, the model and its checkpoints bitwise as before); > 0 = learned per-channel gains of
    width d on the attention and MLP branches of the shared core's blocks only (not the prelude or
    coda), initialised to this value (the paper: 1e-4). Finite, >= 0."""
    # ---- component switches (the paper's sequential ablation, Fig. 5; defaults: the full model) ----
    injection: Literal["concat", "state", "none"] = "concat"
    """What feeds the core: `concat` W_proj [h + eps_x, h_pre] (prelude re-injection, the full
    model), `state` W_h (h + eps_x) (a projection of the state alone, no anchor), `none` h + eps_x
    itself (no projection)."""
    gate: Literal["learned", "none"] = "learned"
    """`learned`: h^(i) = g h^(i-1) + (1 - g) o with the elementwise gate (the full model); `none`:
    h^(i) = o, the core's output replaces the state (no gate parameters, sigma_g unused)."""
    state_noise: Literal["every_step", "init"] = "every_step"
    """When eps_x is added in training: at every step (the full model) or only at the first, to
    the prelude output (noise at initialisation only)."""

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">", 0, tau=self.tau)
        out += out_of_bounds(path, ">=", 0, sigma_x=self.sigma_x, sigma_g=self.sigma_g, layerscale=self.layerscale)
        for name, allowed in (("injection", ("concat", "state", "none")), ("gate", ("learned", "none")),
                              ("state_noise", ("every_step", "init"))):
            if getattr(self, name) not in allowed:
                out.append(f"{path}.{name}={getattr(self, name)!r} must be one of {allowed}")
        if not 1 <= self.r_min <= max(self.n_loops, 1):
            out.append(f"{path}.r_min={self.r_min} must satisfy 1 <= r_min <= n_loops={self.n_loops}")
        return out
