"""The layerwise Recurrent Transformer as the family `rt`: config.py (RTConfig, FLAVOURS, the dense
partners), model.py (RT, RTLayer: the equations and the readings of SPEC section 9), tiled.py (the
exact tiled prefill scan and its per-position oracle).

Counting (rgpt_dist.flops; d = d_model, S the sequence length, L = n_layer):
- a "block" is an RT layer (unique_blocks = block_executions = L): Eq. 1's 24 d^2 + 4 S d per token
  (q, O, the MLP and the temporary pair's K, V: a Transformer block's matmuls; position t reads t
  keys, t - 1 persistent and its temporary one, as a Transformer's causal attention does, counted in
  full as Eq. 1 counts attention);
- plus the persistent pair's K and V projections of each layer's output: 4 d^2 per token and layer
  (`step_flops`, SPEC: "decoding costs about 4 d^2 more FLOPs per token and layer");
- the head 2 d V apart, as every family (untied: the same matmul, V x d more parameters).
What runs (`executed_sequence_flops`, torch's counter) differs in the attention only: the tiled scan
multiplies each (query i, key j < i) pair once in the folds' matmuls, 4 d per pair, 2 d (S - 1) per
token and layer, and the temporary pairs elementwise (not matmuls); the naive scan multiplies each
query by its t - 1 persistent keys and its temporary one, 2 d (S + 1) per token and layer.

Parameters: an RT layer has exactly a Transformer block's (the persistent pair reuses the layer's K,
V, input norm and QK-norm gains; `extra_params`: a full-width or biased QK-norm's beyond the shared
count's two head_dim gains); the untied head adds padded_vocab_size x d (`head_params`, counted
with the embeddings: the non-embedding count is the layers' and the final norm's). The
dense partners (`rt-dense-*`, gpt2 family, config.DENSE_FLAVOURS) have the same block options and
shapes with GPT-2's tied head: each RT flavour has its partner's parameters plus V x d.

Tensor parallelism: q and kv column-, O row-parallel (whole heads per shard, ALiBi's slopes sliced
with them), the MLP as the shared layers', the untied head vocabulary-parallel like wte; the per-position
step all-reduces O's and the MLP's outputs once per position and layer (rt.model.RTLayer says what that
costs). tp = 2 x dp = 2 reproduces one rank (tests/models/rt/test_rt_tp.py).

Hugging Face export: rgpt_dist.export.hf_looped_writer (remote code shipping model.py and tiled.py):
the adapter's transformers cache holds each layer's persistent pairs in DynamicLayers (make_cache(store=)),
so beam search, batch selection and crop work on it (no carried state); the untied head is stored as
embed.unembed (config.json: tie_word_embeddings false).

Declared unsupported (`refusals`, each quoted by its refusal): parallel.compile=blocks' layers;
parallel.compile=model, and model.qk_norm_span=width under tensor parallelism (the authors' full-width
QK-norm needs every head's features on one rank), by config validation (`run_problems`). Imports no torch.
"""
from __future__ import annotations

from typing import Any

from rgpt_dist.models.rt.config import FLAVOURS, RTConfig
from rgpt_dist.models.spec import FamilySpec, block_flops


def scan_flops(cfg: Any, seq_len: int) -> float:
    """Matmul FLOPs per token and layer of one layer's attention as the configured scan runs it
    (module docstring): tiled 2 d (S - 1), naive 2 d (S + 1)."""
    return 2.0 * cfg.d_model * (seq_len - 1 if cfg.prefill == "tiled" else seq_len + 1)


class RTSpec(FamilySpec):
    name = "rt"
    title = "Recurrent Transformer"
    config = RTConfig
    model = "rgpt_dist.models.rt.model:RT"
    flavours = FLAVOURS
    dense_reference = {name: name.replace("rt-", "rt-dense-", 1) for name in FLAVOURS
                       if not name.startswith("rt-authors-")}  # the authors' preset has no dense partner here
    kv_strategies = ("full",)
    cached_generation = True
    hf_writer = "rgpt_dist.export.hf_looped_writer:write_hf_looped"  # ships model.py, tiled.py (remote code)
    refusals = {
        "compile_blocks": "parallel.compile=blocks compiles the head only: an RT layer is not a shared-layer Block, "
                          "and compiling RTLayer whole would unroll its per-position scan; the per-position step "
                          "(O, the MLP, the persistent pair) is not yet a module of its own that one graph could serve",
    }

    def run_problems(self, cfg: Any) -> list[str]:
        """model.qk_norm_span=width under parallel.tp_size > 1 (a rank holds its heads' features only);
        parallel.compile=model: one graph would unroll the scan's
        per-position loop (seq_len steps x n_layer layers). `blocks` compiles the head only (RT has
        no shared-layer Block) and the layers run eagerly."""
        out = super().run_problems(cfg)
        m = cfg.model
        if cfg.parallel.tp_size > 1 and m.qk_norm and m.qk_norm_span == "width":
            out.append(f"model.qk_norm_span='width' is not supported with parallel.tp_size={cfg.parallel.tp_size}: "
                       "the norm needs all d_model features of q and k, a rank holds only its heads'; use "
                       "model.qk_norm_span=head (or model.qk_norm=false), or parallel.tp_size=1")
        if cfg.parallel.compile == "model":
            out.append("parallel.compile=model is not supported by model family 'rt': the whole forward would "
                       "unroll its per-position scan (seq_len steps x n_layer layers) into one graph; use "
                       "parallel.compile=blocks or none")
        return out

    # ---- parameters -------------------------------------------------------------------------
    def extra_params(self, cfg: Any) -> int:
        """QK-norm beyond the shared count's two head_dim gains per layer (flops.block_params): with
        qk_norm_span=width the gains are d wide, with qk_norm_type=layernorm and bias each has a bias."""
        if not cfg.qk_norm:
            return 0
        size = cfg.d_model if cfg.qk_norm_span == "width" else cfg.head_dim
        per_norm = size * (2 if cfg.qk_norm_type == "layernorm" and cfg.bias else 1)
        return cfg.n_layer * (2 * per_norm - 2 * cfg.head_dim)

    def head_params(self, cfg: Any) -> int:
        """The untied head's padded_vocab_size x d_model (0 with tie_embeddings), counted with the
        embeddings: the authors' "150M non-embedding" leaves out both vocabulary matrices."""
        return 0 if cfg.tie_embeddings else cfg.padded_vocab_size * cfg.d_model

    # ---- FLOPs per token ----------------------------------------------------------------------
    def step_flops(self, cfg: Any, r: float | None = None) -> float:
        """The persistent pair's K and V maps of each layer's output: L x 4 d^2."""
        return float(cfg.n_layer * 4 * cfg.d_model * cfg.d_model)

    def executed_sequence_flops(self, cfg: Any, seq_len: int, r: float | None = None) -> float:
        """The configured scan's attention matmuls (scan_flops) in place of Eq. 1's 4 S d per layer."""
        return cfg.n_layer * (scan_flops(cfg, seq_len) - 4.0 * seq_len * cfg.d_model)

    def recompute_flops(self, cfg: Any, seq_len: int, r: float | None, mode: str) -> float:
        """Every layer is a checkpoint unit: its whole executed forward."""
        return (cfg.n_layer * block_flops(cfg, seq_len) + self.step_flops(cfg)
                + self.executed_sequence_flops(cfg, seq_len))

    # ---- inference ----------------------------------------------------------------------------
    def cached_layers(self, cfg: Any, strategy: str, r: int | None) -> int:
        """One K/V store per layer (the persistent pairs): a Transformer's cache."""
        return cfg.n_layer


SPEC = RTSpec()
__all__ = ["SPEC", "RTConfig"]
