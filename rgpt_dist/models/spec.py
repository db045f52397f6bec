"""Family specs: one object per model family owning everything family-specific (in the spirit of
torchtitan's `ModelSpec`). Every other module asks the spec; nothing outside a family's folder
tests which family a config belongs to.

A family is a package `rgpt_dist/models/<name>/` whose `__init__.py` defines `SPEC`, an instance of
a `FamilySpec` subclass, and imports no torch (configs are loaded and validated before any tensor
exists); its model class lives in a sibling module and is imported only when built. Packages are
discovered, so adding a family is adding its folder (see docs/families.md).

This module is also the family registry (`families`, `spec_for`): the base that both the config
package and the families import, at module level. It imports neither, so there is no cycle; only
discovery (the first `families()` call) imports the family packages.

Counting conventions (rgpt_dist.flops builds on them): a "block" is one GPT-2 pre-norm block
(24 d^2 + 4 S d forward FLOPs per token at sequence length S, Eq. 1); a family adds its own
per-depth terms (RecurrentGPT's W_proj and gate, an adapter, LoRA) through `step_flops`, and its
own parameters beyond blocks, embeddings and the final LayerNorm through `extra_params`. The
looped scaling law's split (rgpt_dist.flops.param_split) asks `recurrent_blocks` and `step_params`.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, ClassVar
import rgpt_dist.models as models


def _load(path: str) -> Any:
    """'package.module:attribute' -> the attribute (imported now)."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


class FamilySpec:
    """Defaults describe a dense stack of `n_layer` blocks; families override what differs."""

    name: ClassVar[str] = ""
    """The config's `family` value."""
    title: ClassVar[str] = ""
    """The method name in the paper's Table 1 (and `rgpt-eval grid`)."""
    config: ClassVar[type]
    """The family's config dataclass (a ModelConfig subclass)."""
    model: ClassVar[str] = ""
    """'module:Class' of the model (imported lazily: building needs torch, configs do not)."""
    hf_writer: ClassVar[str] = ""
    """'module:function' writing the Hugging Face export: f(state_dict, cfg, out_dir, *, dtype, **inference)."""
    flavours: ClassVar[dict[str, dict[str, Any]]] = {}
    """Named sizes: flavour name -> model-section mapping (family included)."""
    dense_reference: ClassVar[dict[str, str]] = {}
    """Flavour -> the dense flavour its Table 1 cell compares it with."""
    paper_table1: ClassVar[dict[str, tuple[float, float]]] = {}
    """Flavour -> (Params, FLOPs/fwd) as the paper prints them."""
    paper_val_loss: ClassVar[dict[str, float]] = {}
    """Flavour -> the paper's Table 1 validation loss at the standard 20k-step budget."""
    paper_params_note: ClassVar[str] = ""
    """What the paper's Params column leaves out for this family (RRT: '+LoRA')."""
    table1_row: ClassVar[int] = 99
    """Position of the family's row within a Table 1 cell (dense 0, MoR 1, Poisson 2, Ouro 3, RRT 4,
    RecurrentGPT 5)."""
    recurrent: ClassVar[bool] = False
    """Whether forward takes a depth r (and all_exits): the early-exit curve exists."""
    diagnostics: ClassVar[bool] = False
    """Whether `rgpt-eval diagnostics` applies (RecurrentGPT's per-step gate and state statistics)."""
    kv_strategies: ClassVar[tuple[str, ...]] = ("full", "first", "last", "average")
    """The KV-cache strategies its make_cache accepts (rgpt_dist.models.kv_cache)."""
    learned_exit: ClassVar[bool] = False
    """Whether the model decides per token when to stop (Ouro's exit gate): its model has
    `exits_at_thresholds(idx, targets, thresholds)` and the spec `exit_flops(cfg, seq_len, depth)`."""
    supports_tp: ClassVar[bool] = True
    """Whether parallel.tp_size > 1 may run the family. False: config validation (`run_problems`)
    refuses it before any process group starts, naming `refusals['supports_tp']`."""
    cached_generation: ClassVar[bool] = True
    """Whether the model has `make_cache` (KV-cached decoding). False: `generate` refuses a cache
    strategy naming `refusals['cached_generation']` (strategy=None, recomputing the prefix, runs)."""
    refusals: ClassVar[dict[str, str]] = {}
    """Why the family lacks a feature, by declaration: 'supports_tp', 'cached_generation' (either
    False) and 'hf_writer' (empty: no Hugging Face export); every refusal quotes it. 'compile_blocks':
    parallel.compile=blocks runs but compiles less than the family's layers (the reason says what)."""

    task_suite: ClassVar[str] = "algorithmic"
    """The suite whose tasks `data.task` may name for this model: `algorithmic` (a language model on
    the RLT paper's tasks, rgpt_dist.algorithmic.loader) or `thinking` (rgpt_dist.thinking.loader)."""
    compute_matching: ClassVar[str] = ""
    """How the grid offers this family at its cell's dense training compute (`rgpt-eval grid`, issue #29):
    "" none; "tokens": the same layout trained on more tokens, steps raised until its training FLOPs
    equal the dense model's (rgpt_dist.studies.compare.grid.flop_matched_steps; MoR's own comparison)."""
    language_model: ClassVar[bool] = True
    """False for a task model (TASK_MODEL_MODULES): built, validated and trained like a family, but
    not one of `families()` (no Table 1 row, no generation or export)."""

    # ---- construction ----------------------------------------------------------------------
    def build(self, cfg: Any, factory: Any = None) -> Any:
        return _load(self.model)(cfg, factory)

    def write_hf(self, *args: Any, **kwargs: Any) -> Any:
        if not self.hf_writer:
            raise ValueError(self.refusal("hf_writer"))
        return _load(self.hf_writer)(*args, **kwargs)

    def refusal(self, declaration: str) -> str:
        """The message refusing what `declaration` (a key of `refusals`) says is not supported."""
        what = {"supports_tp": "does not support tensor parallelism",
                "cached_generation": "does not support cached generation (a KV cache)",
                "hf_writer": "has no Hugging Face export"}.get(declaration, f"does not support {declaration}")
        why = self.refusals.get(declaration)
        return f"model family {self.name!r} {what}" + (f": {why}" if why else "")

    def run_problems(self, cfg: Any) -> list[str]:
        """What a whole run config (rgpt_dist.config.Config) asks of this family that it cannot do,
        each naming the offending value and the reason; Config.problems reports them before any
        process group starts. Here: parallel.tp_size > 1 when `supports_tp` is False."""
        if not self.supports_tp and cfg.parallel.tp_size > 1:
            return [f"parallel.tp_size={cfg.parallel.tp_size}: {self.refusal('supports_tp')}"]
        return []

    # ---- depth ------------------------------------------------------------------------------
    def default_depth(self, cfg: Any) -> int | None:
        """R: the depth forward runs when given none (None for families without a depth)."""
        return None

    def depth_sampler(self, cfg: Any) -> Any:
        """The training depth schedule, r = sampler(seed, step) on every rank; None: no depth."""
        return None

    def max_eval_depth(self, cfg: Any) -> int | None:
        """The deepest r evaluation may run (None: any depth; dense models: no depth at all)."""
        return None

    def layout(self, cfg: Any, r: int | None = None) -> str:
        """The paper's shorthand: '12L' for dense models, '2+5x4+2' for prelude/core/coda ones."""
        return f"{cfg.n_layer}L"

    def width_overrides(self, d_model: int) -> dict[str, Any]:
        """Model fields sized relative to the width, for a flavour shrunk to d_model (CPU-scale
        comparisons): their values at that width. None here."""
        return {}

    # ---- parameters -------------------------------------------------------------------------
    def unique_blocks(self, cfg: Any) -> int:
        return cfg.n_layer

    def extra_params(self, cfg: Any) -> int:
        """Parameters beyond the blocks, the embeddings and the final LayerNorm."""
        return 0

    def head_params(self, cfg: Any) -> int:
        """An untied LM head's parameters, counted with the embeddings (the non-embedding count leaves
        out wte, wpe and this head, as the Recurrent Transformer's authors count); 0: tied to wte."""
        return 0

    def param_breakdown(self, cfg: Any) -> dict[str, int]:
        """Named parts of `extra_params` that Table 1 reports apart (RRT's LoRA)."""
        return {}

    def recurrent_blocks(self, cfg: Any) -> int:
        """Blocks of the shared, looped part (the looped scaling law's N_rec, SPEC section 10): 0 for
        a model without a depth recurrence; LoopedSpec: n_rec."""
        return 0

    def step_params(self, cfg: Any) -> int:
        """The part of `extra_params` applied at every recurrence step and shared across steps (N_rec
        beside the recurrent blocks); parameters used by one step only, or off the state's path,
        belong to N_once. 0 here."""
        return 0

    # ---- FLOPs per token (matmuls, 2 per multiply-add; see rgpt_dist.flops) -----------------
    def block_executions(self, cfg: Any, r: float | None = None) -> float:
        """Blocks run per token at depth r (default R)."""
        return float(cfg.n_layer)

    def step_flops(self, cfg: Any, r: float | None = None) -> float:
        """Eq. 1's forward FLOPs per token beyond the blocks at depth r (RecurrentGPT: r * 10 d^2)."""
        return 0.0

    def executed_step_flops(self, cfg: Any, r: float | None = None) -> float:
        """`step_flops` as this implementation runs them per token (what torch's flop counter sees)."""
        return self.step_flops(cfg, r)

    def sequence_flops(self, cfg: Any, seq_len: int, r: float | None = None) -> float:
        """Forward FLOPs per token beyond `block_executions` full-context blocks and `step_flops`
        that depend on the sequence length (Mixture-of-Recursions: a recursion attends over its
        kept tokens only, a negative term). 0 here."""
        return 0.0

    def executed_sequence_flops(self, cfg: Any, seq_len: int, r: float | None = None) -> float:
        """`sequence_flops` as this implementation runs them (what torch's flop counter sees): the
        same unless the family computes more or less than its architecture needs (RLT-2's chunks
        attend over whole chunks). Defaults to `sequence_flops`."""
        return self.sequence_flops(cfg, seq_len, r)

    def forward_flops(self, cfg: Any, seq_len: int, r: float | None = None) -> float:
        """Eq. 1: forward FLOPs per token without the head at depth r (rgpt_dist.flops.forward_flops)."""
        return float(self.block_executions(cfg, r) * block_flops(cfg, seq_len) + self.step_flops(cfg, r)
                     + self.sequence_flops(cfg, seq_len, r))

    def head_flops(self, cfg: Any) -> float:
        """The output head's forward FLOPs per token: the LM head's 2 d V (padded vocabulary)."""
        return 2.0 * cfg.d_model * cfg.padded_vocab_size

    def executed_overhead_flops(self, cfg: Any, r: float | None = None) -> float:
        """Matmul FLOPs a forward at depth r runs once, whatever its number of tokens (RRT: forming
        its merged weights)."""
        return 0.0

    def no_grad_forward_flops(self, cfg: Any, seq_len: int, r: int) -> float:
        """Forward FLOPs per token at depth r that run without autograd (truncated backprop): they
        have no backward, so a training step costs 3 x forward minus 2 x these."""
        return 0.0

    def train_readout_flops(self, cfg: Any, seq_len: int, r: int) -> float:
        """Forward FLOPs per token (with backward) that training runs beyond the inference forward
        at depth r: Ouro's readout of every iteration, not only the last."""
        return 0.0

    def recompute_flops(self, cfg: Any, seq_len: int, r: float | None, mode: str) -> float:
        """Forward FLOPs per token recomputed in backward by activation checkpointing in `mode`
        (recurrence | blocks; the caller handles none and selective). Dense: every block."""
        return cfg.n_layer * block_flops(cfg, seq_len)

    # ---- inference --------------------------------------------------------------------------
    def cached_layers(self, cfg: Any, strategy: str, r: int | None) -> int:
        """Attention layers holding K/V in a cache for depth r under `strategy`."""
        return cfg.n_layer


def block_flops(cfg: Any, seq_len: int) -> float:
    """Eq. 1's forward FLOPs per token of one block: 24 d^2 (qkv, out, MLP) + 4 S d (attention); with
    model.mlp / d_ff, 8 d^2 + 2 k d d_ff for k MLP matrices (gelu 2, swiglu 3) instead of 24 d^2."""
    d, k = cfg.d_model, 3 if getattr(cfg, "mlp", "gelu") == "swiglu" else 2
    return float(8 * d * d + 2 * k * d * (getattr(cfg, "d_ff", 0) or 4 * d) + 4 * seq_len * d)


_SPECS: dict[str, FamilySpec] | None = None
TASK_MODEL_MODULES = ("rgpt_dist.thinking.spec",)
"""Modules defining the `SPEC` of a task model: a classifier trained by the same trainer on a task
suite (`language_model = False`), not a language-model family."""


def _register(specs: dict[str, FamilySpec], spec: Any) -> None:
    if isinstance(spec, FamilySpec):
        if spec.name in specs:
            raise RuntimeError(f"model family {spec.name!r} is registered twice")
        specs[spec.name] = spec


def _discover() -> dict[str, FamilySpec]:
    specs: dict[str, FamilySpec] = {}
    for info in sorted(pkgutil.iter_modules(models.__path__), key=lambda m: m.name):
        if info.ispkg:
            _register(specs, getattr(importlib.import_module(f"{models.__name__}.{info.name}"), "SPEC", None))
    for module in TASK_MODEL_MODULES:
        _register(specs, getattr(importlib.import_module(module), "SPEC", None))
    return specs


def all_specs() -> dict[str, FamilySpec]:
    """Every registered spec, language-model families and task models: name -> spec (discovered once)."""
    global _SPECS
    if _SPECS is None:
        _SPECS = _discover()
    return _SPECS


def families() -> dict[str, FamilySpec]:
    """The language-model families (what grids, exports and the family contract iterate): name -> spec."""
    return {name: spec for name, spec in all_specs().items() if spec.language_model}


def spec_for(family_or_cfg: Any) -> FamilySpec:
    """The spec of a family (or task model) name or of a model config."""
    family = family_or_cfg if isinstance(family_or_cfg, str) else family_or_cfg.family
    specs = all_specs()
    if family not in specs:
        raise ValueError(f"unknown model family {family!r} (known: {', '.join(specs)})")
    return specs[family]


class LoopedSpec(FamilySpec):
    """Prelude / shared core / coda families (LoopedConfig): n_pre + n_rec x r + n_coda blocks run
    per token, any depth r >= 0 at evaluation, the shared core's K/V cached per step (`full`) or
    compressed to one entry per core block (see rgpt_dist.models.kv_cache)."""

    recurrent = True

    def default_depth(self, cfg: Any) -> int:
        return cfg.n_loops

    def layout(self, cfg: Any, r: int | None = None) -> str:
        return f"{cfg.n_pre}+{cfg.n_rec}x{cfg.n_loops if r is None else r}+{cfg.n_coda}"

    def unique_blocks(self, cfg: Any) -> int:
        return cfg.n_pre + cfg.n_rec + cfg.n_coda

    def recurrent_blocks(self, cfg: Any) -> int:
        """The shared core's n_rec blocks (the prelude and coda run once: N_once)."""
        return cfg.n_rec

    def block_executions(self, cfg: Any, r: float | None = None) -> float:
        return float(cfg.n_pre + cfg.n_rec * (cfg.n_loops if r is None else r) + cfg.n_coda)

    def grad_steps(self, cfg: Any, r: float) -> float:
        """Steps of a depth-r training forward that carry gradient (all: no truncated backprop)."""
        return r

    def no_grad_forward_flops(self, cfg: Any, seq_len: int, r: int) -> float:
        """The steps before the last grad_steps: their core blocks and per-step extras (Eq. 1 form)."""
        return (r - self.grad_steps(cfg, r)) * (cfg.n_rec * block_flops(cfg, seq_len) + self.step_flops(cfg, 1))

    def recompute_flops(self, cfg: Any, seq_len: int, r: float | None, mode: str) -> float:
        """`recurrence`: every recurrence step with gradient (the core's blocks and the executed
        per-step extras; steps run without autograd save nothing to recompute); `blocks`: also
        every prelude and coda block."""
        r = cfg.n_loops if r is None else r
        per_step = self.executed_step_flops(cfg, 2) - self.executed_step_flops(cfg, 1)  # the per-step part
        flops = self.grad_steps(cfg, r) * (cfg.n_rec * block_flops(cfg, seq_len) + per_step)
        return flops + ((cfg.n_pre + cfg.n_coda) * block_flops(cfg, seq_len) if mode == "blocks" else 0.0)

    def cached_layers(self, cfg: Any, strategy: str, r: int | None) -> int:
        """n_pre + n_coda + n_rec x (r if full else 1); no core entry at r = 0, where no step runs."""
        r = cfg.n_loops if r is None else r
        return cfg.n_pre + cfg.n_coda + cfg.n_rec * (r if strategy == "full" else min(r, 1))
