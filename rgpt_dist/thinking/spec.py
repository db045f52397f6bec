"""The silent-thinking classifier as a task model (rgpt_dist.models.spec.TASK_MODEL_MODULES): built,
validated and trained by the project's trainer like a family, but not a language model, so not one
of `families()` (no Table 1 row, no generation, no export). Torch-free, like every spec.

`ThinkingConfig` is the trainer's model section: ThinkingModelConfig's fields (rgpt_dist/thinking/
config.py), which win, over ModelConfig's, which run-level checks read (block_size bounds
train.seq_len; the rest are unused) plus `fixed_layers` (the fixed-depth baseline). Flavours are
`thinking-<setting>` (the authors' graph, logic and relational settings, `graph-debug`) with the
task's vocabulary and readout, and `thinking-<setting>-fixed`, the fixed-depth baseline of
BASELINE_LAYERS blocks.

Counting (rgpt_dist.flops): the shared block is one GPT-2-shaped block (attention with biases,
d -> d_ff -> d FFN, two LayerNorms: `block_flops`, `block_params`) run `steps` times; the gate
(2 d^2 + d), the LayerScale gains, the depth embedding and the role vectors are `extra_params`, the
classifier head `head_params`; per token and step the gate adds 4 d^2 FLOPs, and the head 2 (K d^2 +
d) per example, spread over the S positions (`sequence_flops`); no LM head.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rgpt_dist.sections import out_of_bounds
from rgpt_dist.models.config import MAX_BLOCKS, ModelConfig
from rgpt_dist.models.spec import FamilySpec, block_flops
from rgpt_dist.thinking.config import BASELINE_LAYERS, FLAVOURS as SETTINGS, ThinkingModelConfig, steps_sampler

TASK_OF = {"graph": "graph", "graph-debug": "graph", "logic": "logic", "relational": "relational"}
"""The task each setting is built for (its vocabulary, readout and positions)."""
TASK_INPUTS = {"graph": {"vocab_size": 27, "readout_k": 2, "n_roles": 2},
               "logic": {"vocab_size": 9, "readout_k": 1, "n_roles": 0},
               "relational": {"vocab_size": 54, "readout_k": 1, "n_roles": 0}}
"""What each task hands the model (its vocabulary, readout positions and roles), written out so that
specs stay free of numpy (spec discovery runs wherever a config is read, e.g. on a bare CUDA torch
install); tests/thinking/test_spec.py checks them against the generators."""


@dataclasses.dataclass
class ThinkingConfig(ThinkingModelConfig, ModelConfig):
    """The thinking model (or its fixed-depth baseline) as a run's model section."""

    family: str = "thinking"
    """Model family (fixed for this class)."""
    fixed_layers: int = 0
    """0: the silent-thinking model (one shared block, `steps` times); L >= 1: the authors' fixed-depth
    baseline, L distinct blocks without gate, depth embedding or LayerScale (rgpt_dist.thinking.model.
    FixedDepthModel); 0 <= fixed_layers <= 1024."""
    pos_encoding: str = "none"
    """Unused (`positions` says how attention knows positions); `none`: no learned position table."""

    def problems(self, path: str = "model") -> list[str]:
        out = ThinkingModelConfig.problems(self, path)
        out += out_of_bounds(path, ">=", 0, fixed_layers=self.fixed_layers)
        return out + out_of_bounds(path, "<=", MAX_BLOCKS, fixed_layers=self.fixed_layers)


def _flavour(setting: str, fixed: bool) -> dict[str, Any]:
    task = TASK_INPUTS[TASK_OF[setting]]
    return {"family": "thinking", **SETTINGS[setting], "vocab_size": task["vocab_size"],
            "readout_k": task["readout_k"], "fixed_layers": BASELINE_LAYERS[setting] if fixed else 0}


class ThinkingSpec(FamilySpec):
    name = "thinking"
    title = "Silent thinking (depth-recurrent classifier)"
    config = ThinkingConfig
    model = "rgpt_dist.thinking.trainable:build"
    flavours = {f"thinking-{s}{'-fixed' if fixed else ''}": _flavour(s, fixed) for s in SETTINGS for fixed in (False, True)}
    recurrent = True
    language_model = False
    task_suite = "thinking"
    supports_tp = False
    cached_generation = False
    refusals = {"supports_tp": "a classifier of at most a few million parameters: one process holds it",
                "cached_generation": "a bidirectional classifier generates nothing",
                "hf_writer": "a classifier, not a causal language model"}

    def run_problems(self, cfg: Any) -> list[str]:
        """A thinking task that fits the model; no compilation."""
        out = super().run_problems(cfg)
        m, name, task = cfg.model, cfg.data.task, TASK_INPUTS.get(cfg.data.task)
        if task is None:  # none yet (a flavour loaded alone; preflight refuses training without one), or
            return out    # another suite's (Config._task_problems reports the pair)
        if m.vocab_size < task["vocab_size"]:
            out.append(f"model.vocab_size={m.vocab_size} is smaller than data.task={name!r}'s "
                       f"vocabulary of {task['vocab_size']}")
        if m.readout_k != task["readout_k"]:
            out.append(f"model.readout_k={m.readout_k} differs from data.task={name!r}'s {task['readout_k']} "
                       f"readout positions")
        if m.n_roles != task["n_roles"]:
            out.append(f"model.n_roles={m.n_roles}: data.task={name!r} marks {task['n_roles']} roles")
        if cfg.parallel.compile_mode() != "none":
            out.append(f"parallel.compile={cfg.parallel.compile!r} is not supported by the thinking models (none)")
        return out

    # ---- depth ------------------------------------------------------------------------------
    def default_depth(self, cfg: Any) -> int | None:
        return None if cfg.fixed_layers else cfg.train_steps_max

    def depth_sampler(self, cfg: Any) -> Any:
        return None if cfg.fixed_layers else steps_sampler(cfg)

    def max_eval_depth(self, cfg: Any) -> int | None:
        return None if cfg.fixed_layers else cfg.max_steps

    def layout(self, cfg: Any, r: int | None = None) -> str:
        return f"{cfg.fixed_layers} blocks" if cfg.fixed_layers else f"1x{self.default_depth(cfg) if r is None else r}"

    # ---- parameters -------------------------------------------------------------------------
    def unique_blocks(self, cfg: Any) -> int:
        return cfg.fixed_layers or 1

    def recurrent_blocks(self, cfg: Any) -> int:
        return 0 if cfg.fixed_layers else 1

    def step_params(self, cfg: Any) -> int:
        """The gate and the LayerScale gains, applied at every step."""
        d = cfg.d_model
        return 0 if cfg.fixed_layers else 2 * d * d + d + (2 * d if cfg.gains else 0)

    def extra_params(self, cfg: Any) -> int:
        """Gate and gains (step_params), the depth embedding, the role vectors."""
        depth = 0 if cfg.fixed_layers else cfg.max_steps * cfg.d_model
        return self.step_params(cfg) + depth + cfg.n_roles * cfg.d_model

    def head_params(self, cfg: Any) -> int:
        """The classifier head: LayerNorm(K d), Linear(K d, d), Linear(d, 1)."""
        k, d = cfg.readout_k * cfg.d_model, cfg.d_model
        return 2 * k + k * d + d + d + 1

    # ---- FLOPs per token ----------------------------------------------------------------------
    def block_executions(self, cfg: Any, r: float | None = None) -> float:
        return float(cfg.fixed_layers or (self.default_depth(cfg) if r is None else r))

    def step_flops(self, cfg: Any, r: float | None = None) -> float:
        return 0.0 if cfg.fixed_layers else 4.0 * cfg.d_model ** 2 * (self.default_depth(cfg) if r is None else r)

    def sequence_flops(self, cfg: Any, seq_len: int, r: float | None = None) -> float:
        return 2.0 * (cfg.readout_k * cfg.d_model ** 2 + cfg.d_model) / seq_len

    def head_flops(self, cfg: Any) -> float:
        return 0.0

    def recompute_flops(self, cfg: Any, seq_len: int, r: float | None, mode: str) -> float:
        """Every mode recomputes the block (and the gate) at every step: the forward but the head."""
        return self.block_executions(cfg, r) * block_flops(cfg, seq_len) + self.step_flops(cfg, r)

    def cached_layers(self, cfg: Any, strategy: str, r: int | None) -> int:
        return 0


SPEC = ThinkingSpec()
