"""Ouro (Zhu et al. 2025; SPEC section 4): config.py (OuroConfig), model.py (OuroGPT, its exit gate
and entropy-regularised objective). Trained in the three isoFLOPs cells of Table 1."""
from __future__ import annotations

from typing import Any

from rgpt_dist.models.flavours import CELLS, DEBUG_WIDTH, looped
from rgpt_dist.depth import FixedDepth
from rgpt_dist.models.ouro.config import OuroConfig
from rgpt_dist.models.spec import LoopedSpec, block_flops

ISOFLOPS = [cell for cell in CELLS if cell.endswith("isoflops")]


class OuroSpec(LoopedSpec):
    name = "ouro"
    title = "Ouro"
    table1_row = 3
    config = OuroConfig
    model = "rgpt_dist.models.ouro.model:OuroGPT"
    hf_writer = "rgpt_dist.export.hf_looped_writer:write_hf_looped"
    learned_exit = True
    flavours = {**{f"ouro-{cell}": looped("ouro", cell) for cell in ISOFLOPS},
                "ouro-debug": {"family": "ouro", **DEBUG_WIDTH, "n_pre": 1, "n_rec": 1, "n_loops": 2, "n_coda": 1}}
    dense_reference = {**{f"ouro-{cell}": CELLS[cell][1] for cell in ISOFLOPS}, "ouro-debug": "gpt2-debug"}
    # Table 1 prints the same Params and FLOPs/fwd for every method of a cell
    paper_table1 = {"ouro-small-isoflops": (36e6, 1.84e9), "ouro-medium-isoflops": (124e6, 7.35e9),
                    "ouro-large-isoflops": (288e6, 21.1e9)}
    paper_val_loss = {"ouro-small-isoflops": 3.19, "ouro-medium-isoflops": 2.93, "ouro-large-isoflops": 2.82}

    def depth_sampler(self, cfg: Any):
        """Depth-fixed in training: every iteration 1..R is an exit of the one objective."""
        return FixedDepth(cfg.n_loops)

    def extra_params(self, cfg: Any) -> int:
        """The exit gate: its norm (none when it reads the loop-normed state) and w (d) + b; with
        loop_norm the step's norm."""
        gate_norm = 0 if cfg.gate_input == "state" and cfg.loop_norm else _norm_params(cfg)
        return gate_norm + cfg.d_model + 1 + self.step_params(cfg)

    def step_params(self, cfg: Any) -> int:
        """The loop norm (loop_norm), which runs at every step with the same weights; else 0: the
        exit gate reads every iteration but never feeds the state (it is a readout, like the coda
        it follows, which training also runs per iteration), so it is N_once; N_rec is the n_rec
        core blocks. Debatable under the law: 2d + 1 parameters either way."""
        return _norm_params(cfg) if cfg.loop_norm else 0

    def _readout_flops(self, cfg: Any, seq_len: int) -> float:
        """One iteration's exit: coda, head (2 d V) and gate (2 d) per token."""
        return cfg.n_coda * block_flops(cfg, seq_len) + 2.0 * cfg.d_model * (cfg.padded_vocab_size + 1)

    def train_readout_flops(self, cfg: Any, seq_len: int, r: int) -> float:
        """Training reads out every iteration: r - 1 exits beyond the forward's own readout."""
        return max(r - 1, 0) * self._readout_flops(cfg, seq_len)

    def no_grad_forward_flops(self, cfg: Any, seq_len: int, r: int) -> float:
        """0 (every step has gradient), except in the gate stage (stage=gate): everything but the
        exit gates runs without a backward (frozen), so training costs about one forward."""
        if cfg.stage != "gate":
            return super().no_grad_forward_flops(cfg, seq_len, r)
        gates = 2.0 * cfg.d_model * max(r - 1, 0)  # the gates train_readout_flops counts
        return self.forward_flops(cfg, seq_len, r) + self.head_flops(cfg) + self.train_readout_flops(cfg, seq_len, r) - gates

    def recompute_flops(self, cfg: Any, seq_len: int, r: float | None, mode: str) -> float:
        """The skeleton's, plus every iteration's exit (a checkpoint unit of its own); under `blocks`
        its coda blocks, checkpointed again inside it, are recomputed twice. In the gate stage only
        the exits, whose gate has gradient, are recomputed (nothing else records a graph)."""
        r = cfg.n_loops if r is None else r
        if cfg.stage == "gate":
            return r * self._readout_flops(cfg, seq_len)
        nested = r * cfg.n_coda * block_flops(cfg, seq_len) if mode == "blocks" else 0.0
        return super().recompute_flops(cfg, seq_len, r, mode) + r * self._readout_flops(cfg, seq_len) + nested

    def exit_flops(self, cfg: Any, seq_len: int, depth: int) -> float:
        """Forward FLOPs per token (head included) of a token leaving at iteration `depth` in
        per-token-exit inference: the prelude, then per iteration the core, the coda and the gate
        (deciding whether to leave needs the coda's output), and the head once. With
        gate_input=state the gate reads the state: the coda runs once, at the exit."""
        gates = min(depth, cfg.n_loops - 1)
        codas = min(depth, 1) if cfg.gate_input == "state" else depth
        blocks = cfg.n_pre + depth * cfg.n_rec + codas * cfg.n_coda
        return blocks * block_flops(cfg, seq_len) + 2.0 * cfg.d_model * (gates + cfg.padded_vocab_size)


def _norm_params(cfg: Any) -> int:
    """One norm over d: LayerNorm's gain and bias (bias), or a gain alone (RMSNorm, no bias)."""
    return 2 * cfg.d_model if cfg.bias and cfg.norm == "layernorm" else cfg.d_model


SPEC = OuroSpec()
__all__ = ["SPEC", "OuroConfig"]
