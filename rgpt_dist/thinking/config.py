"""The silent-thinking model's section (torch-free), its named settings and its training-steps sampler.

`ThinkingModelConfig` subclasses the config machinery's `Section` (typed fields, attribute docstrings,
`problems()`), not `ModelConfig`: ModelConfig is the *language-model* families' section, selected by
`family` among the registered families (`variant_key`), and carries what these classifiers do not have
(block_size, a tied LM head, pad_vocab_multiple, muP, qk_norm, SwiGLU). The thinking models are
bidirectional binary classifiers and not a family (rgpt_dist.thinking's docstring), so they get a plain
section of their own; its `family` field ("thinking") lets a run config's model section select it as it
selects a family's (rgpt_dist.models.spec's task models). What the run-level checks read of a language
model (block_size, pad_vocab_multiple) it does not have: positions are bounded by the task's max_len.

`FLAVOURS` are the authors' three settings (hhchen1105/Depth-Recurrent-Transformer; SPEC section 8):
graph/graph_experiment.py (d 128, 4 heads, FFN 256, ReLU as its nn.TransformerEncoderLayer, no
LayerScale, no positions, steps U[5, 8] in training, 20 depth rows), nested-expr/logic_experiment.py
(d 256, 8 heads, FFN 1024, GELU, RoPE, LayerScale 1e-4, steps U[4, 16], 28 rows) and
family-reason/family_experiment.py (the same block, steps U[1, 12], 20 rows), plus the CPU-sized
`graph-debug` (d 64). They leave `vocab_size` to the task (`config_for`). `BASELINE_LAYERS` are the
depths of the authors' fixed-depth baselines (graph/baselines.py: 6; seq_baselines.py: logic 8, the
largest training depth; family 5, likewise), which give the "4-6.4x the parameters" of SPEC section 8.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rgpt_dist.sections import Section, nonfinite_fields, out_of_bounds
from rgpt_dist.depth import UniformDepth

ACTIVATIONS = ("gelu", "relu")
"""The FFN's nonlinearity: exact GELU (the sequence tasks') or ReLU (nn.TransformerEncoderLayer's
default, the graph task's)."""
ATTN_INITS = ("linear", "mha")
"""How the attention's projections are initialised (`attn_init`): `linear`, torch's nn.Linear default
for the stacked q/k/v projection and the output projection (weights and biases U(-1/sqrt(d), 1/sqrt(d)),
the distribution of the sequence tasks' separate q/k/v nn.Linear layers; the default), or `mha`,
torch's nn.MultiheadAttention (the graph task's nn.TransformerEncoderLayer): xavier-uniform over the
stacked [3d, d] in-projection (bound sqrt(6 / (d + 3d))), zero in-projection and output biases, the
output weight left at nn.Linear's default."""
POSITIONS = ("none", "rope")
"""How attention knows token positions: not at all (the graph: the adjacency mask is the structure),
or rotary q/k (the sequence tasks)."""
MAX_VOCAB, MAX_WIDTH, MAX_FFN, MAX_STEPS, MAX_ROLES, MAX_READOUT = 2**20, 2**16, 2**18, 1024, 1024, 1024


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass
class ThinkingModelConfig(Section):
    """One shared bidirectional block iterated `steps` times (depth embedding, pre-norm attention and
    FFN with optional LayerScale, identity-biased gate), a readout of K positions and a binary head.
    Defaults are the authors' graph setting (FLAVOURS["graph"]) with a placeholder vocabulary."""

    family: str = "thinking"
    """The model-section selector (a task model's name in rgpt_dist.models.spec, not a language-model
    family); fixed for this class."""
    vocab_size: int = 32
    """Token ids 0..vocab_size - 1 (id 0 is padding: its embedding row is zero); set from the task
    (`config_for`); 1 <= vocab_size <= 2^20."""
    d_model: int = 128
    """Width d of every state; 1 <= d_model <= 2^16."""
    n_head: int = 4
    """Attention heads; d_model must be divisible by it (head_dim even with positions=rope)."""
    d_ff: int = 256
    """The FFN's hidden width (d -> d_ff -> d); 1 <= d_ff <= 2^18."""
    activation: str = "relu"
    """The FFN's nonlinearity: `gelu` (exact, the sequence tasks') or `relu` (the graph task's)."""
    dropout: float = 0.1
    """Dropout probability at the embedding, on the attention weights, after the FFN's activation and
    output, and in the head (the authors' 0.1); 0 <= dropout < 1."""
    ln_eps: float = 1e-5
    """LayerNorm epsilon (torch's default, the authors'); finite, > 0."""
    positions: str = "none"
    """`none` or `rope` (rotary q and k, rotate-half form, position = index in the sequence)."""
    rope_base: float = 10000.0
    """RoPE's frequency base; finite, > 1. Read only with positions=rope."""
    layerscale: float | None = None
    """Initial value of the per-channel LayerScale gains gamma1, gamma2 on the attention and FFN
    branches (the sequence tasks' 1e-4); None or 0 = no LayerScale (gamma = 1, fixed: no parameter);
    finite, >= 0."""
    gate_bias: float = -2.0
    """Initial bias b_z of the gate z = sigmoid(W_z [h'; h] + b_z) (the authors' -2: z = 0.12, mostly
    keep h); finite."""
    max_steps: int = 20
    """Rows of the depth embedding: the largest number of thinking steps a forward accepts;
    1 <= max_steps <= 1024."""
    train_steps_min: int = 5
    """Smallest number of thinking steps drawn in training (U[min, max] per batch); >= 1."""
    train_steps_max: int = 8
    """Largest number drawn in training; train_steps_min <= train_steps_max <= max_steps."""
    n_roles: int = 2
    """Learned role embeddings for role ids 1..n_roles (id 0 adds nothing): the graph's source (1)
    and target (2); 0 = no roles (inputs must then carry none); 0 <= n_roles <= 1024."""
    readout_k: int = 2
    """K: positions whose final states are concatenated for the head (graph 2, source and target;
    sequence tasks 1, CLS); 1 <= readout_k <= 1024."""
    attn_init: str = "linear"
    """The attention projections' initialisation (ATTN_INITS): `linear` (default: torch's nn.Linear
    init, the sequence tasks' q/k/v layers) or `mha` (nn.MultiheadAttention's, the authors' graph
    block: xavier-uniform q/k/v weight, zero biases)."""
    supervision_alpha: float = 0.0
    """a of the loss (1 - a) BCE_final + a mean_t BCE_t: 0 = silent thinking (final step only, the
    authors' default); 0 <= a <= 1."""

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def gains(self) -> float | None:
        """LayerScale's initial value, or None when off (layerscale None or 0)."""
        return self.layerscale or None

    def problems(self, path: str = "model") -> list[str]:
        out = nonfinite_fields(self, path)
        if self.family != "thinking":
            out.append(f"{path}.family={self.family!r} must be 'thinking' for ThinkingModelConfig")
        out += out_of_bounds(path, ">=", 1, vocab_size=self.vocab_size, d_model=self.d_model, n_head=self.n_head,
                             d_ff=self.d_ff, max_steps=self.max_steps, train_steps_min=self.train_steps_min,
                             readout_k=self.readout_k)
        out += out_of_bounds(path, "<=", MAX_VOCAB, vocab_size=self.vocab_size)
        out += out_of_bounds(path, "<=", MAX_WIDTH, d_model=self.d_model)
        out += out_of_bounds(path, "<=", MAX_FFN, d_ff=self.d_ff)
        out += out_of_bounds(path, "<=", MAX_STEPS, max_steps=self.max_steps)
        out += out_of_bounds(path, "<=", MAX_ROLES, n_roles=self.n_roles)
        out += out_of_bounds(path, "<=", MAX_READOUT, readout_k=self.readout_k)
        out += out_of_bounds(path, ">=", 0, n_roles=self.n_roles)
        out += out_of_bounds(path, ">", 0, ln_eps=self.ln_eps)
        out += out_of_bounds(path, ">", 1, rope_base=self.rope_base)
        if not (_number(self.dropout) and 0 <= self.dropout < 1):
            out.append(f"{path}.dropout={self.dropout!r} must be in [0, 1)")
        if self.layerscale is not None:
            out += out_of_bounds(path, ">=", 0, layerscale=self.layerscale)
        if not (_number(self.supervision_alpha) and 0 <= self.supervision_alpha <= 1):
            out.append(f"{path}.supervision_alpha={self.supervision_alpha!r} must be in [0, 1]")
        for name, value, allowed in (("activation", self.activation, ACTIVATIONS),
                                     ("positions", self.positions, POSITIONS),
                                     ("attn_init", self.attn_init, ATTN_INITS)):
            if value not in allowed:
                out.append(f"{path}.{name}={value!r} is not one of {', '.join(allowed)}")
        if self.n_head >= 1 and self.d_model % self.n_head:
            out.append(f"{path}.d_model={self.d_model} is not divisible by {path}.n_head={self.n_head}")
        elif self.positions == "rope" and self.n_head >= 1 and self.head_dim % 2:
            out.append(f"{path}.positions='rope' rotates pairs of features: head_dim = d_model / n_head = "
                       f"{self.head_dim} must be even")
        if self.train_steps_max < self.train_steps_min or self.train_steps_max > self.max_steps:
            out.append(f"{path}.train_steps_max={self.train_steps_max} must be in [train_steps_min="
                       f"{self.train_steps_min}, max_steps={self.max_steps}] (the depth embedding has max_steps rows)")
        return out

    def check(self, path: str = "model") -> None:
        """Raise ValueError listing every problem (before any tensor is built)."""
        problems = self.problems(path)
        if problems:
            raise ValueError("invalid thinking model config:\n  - " + "\n  - ".join(problems))


_SEQUENCE = {"d_model": 256, "n_head": 8, "d_ff": 1024, "activation": "gelu", "positions": "rope",
             "layerscale": 1e-4, "n_roles": 0, "readout_k": 1}
"""The two sequence tasks' block (logic_experiment.py, family_experiment.py): CLS readout, no roles."""
_GRAPH = {"d_model": 128, "n_head": 4, "d_ff": 256, "activation": "relu", "positions": "none",
          "layerscale": None, "n_roles": 2, "readout_k": 2, "max_steps": 20, "train_steps_min": 5,
          "train_steps_max": 8}
"""graph_experiment.py: nn.TransformerEncoderLayer(128, 4, 256, norm_first) (ReLU, no LayerScale),
[h_src; h_tgt] readout with source/target role embeddings; steps U[5, 8], evaluated to 20."""

FLAVOURS: dict[str, dict[str, Any]] = {
    "graph": dict(_GRAPH),
    "logic": {**_SEQUENCE, "max_steps": 28, "train_steps_min": 4, "train_steps_max": 16},
    "relational": {**_SEQUENCE, "max_steps": 20, "train_steps_min": 1, "train_steps_max": 12},
    "graph-debug": {**_GRAPH, "d_model": 64, "n_head": 4, "d_ff": 128},
}
"""The authors' settings by task (model-section fields; vocab_size comes from the task) and the
CPU-sized graph sibling (width 64, FFN 128; same steps)."""

BASELINE_LAYERS: dict[str, int] = {"graph": 6, "logic": 8, "relational": 5, "graph-debug": 6}
"""L of the fixed-depth baselines (L distinct blocks, no sharing, gate or depth embedding): the
authors' graph/baselines.py (6) and seq_baselines.py (the largest training difficulty: logic 8,
family 5)."""


def config_for(flavour: str, task: Any = None, **overrides: Any) -> ThinkingModelConfig:
    """FLAVOURS[flavour] with the task's vocab_size and readout_k (any object with those attributes,
    e.g. a rgpt_dist.thinking task) and then `overrides`; checked (ValueError listing the problems).
    A task whose `positions` attribute differs from the flavour's is refused, naming both."""
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown thinking flavour {flavour!r} (known: {', '.join(FLAVOURS)})")
    fields = dict(FLAVOURS[flavour])
    if task is not None:
        fields["vocab_size"] = task.vocab_size
        fields["readout_k"] = task.readout_k
        positions = getattr(task, "positions", fields["positions"])
        if positions != fields["positions"]:
            raise ValueError(f"task positions={positions!r} differs from flavour {flavour!r}'s "
                             f"positions={fields['positions']!r}")
    unknown = set(overrides) - {f.name for f in dataclasses.fields(ThinkingModelConfig)}
    if unknown:
        raise ValueError(f"{', '.join(sorted(unknown))} is not a field of ThinkingModelConfig")
    cfg = ThinkingModelConfig(**{**fields, **overrides})
    cfg.check()
    return cfg


def steps_sampler(cfg: ThinkingModelConfig, per_micro_batch: bool = False) -> UniformDepth:
    """Training's thinking steps: U{train_steps_min..train_steps_max} per optimizer step (per batch:
    the authors' random.randint per batch), a pure function of (seed, step) -- or of (seed, step,
    micro) with per_micro_batch -- so every rank agrees without communication. It is
    rgpt_dist.depth's UniformDepth, so `step_depths(sampler, seed, step, micro_batches)` and the
    trainer's depth plumbing take it as they take RecurrentGPT's depth sampler."""
    if not 1 <= cfg.train_steps_min <= cfg.train_steps_max <= cfg.max_steps:
        raise ValueError(f"train steps [{cfg.train_steps_min}, {cfg.train_steps_max}] must satisfy 1 <= min <= max "
                         f"<= max_steps={cfg.max_steps}")
    return UniformDepth(cfg.train_steps_min, cfg.train_steps_max, per_micro_batch)

