"""The layerwise Recurrent Transformer's model section (torch-free) and its named sizes.

RT (SPEC section 9; the second abstract of shared/papers/related_abstracts.txt): a stack of n_layer
layers in which each layer attends to key/value pairs computed from its *own* outputs at earlier
positions (the persistent pairs) plus a temporary pair from the current input. rgpt_dist.models.rt
(the spec) and rgpt_dist.models.rt.model (the model) have the equations.

`FLAVOURS` are the authors' settings as SPEC section 9 and their README list them (150M: 12 x 1024
and 6 x 1408; 300M: 24 x 1024, 12 x 1408, 6 x 2048; head_dim 64 everywhere, i.e. 16, 22, 16, 22 and 32
heads; GELU MLP 4 d) with our GPT-2 vocabulary (50,257) and an untied head, in our block (SPEC's
readings: the defaults below), plus the CPU-sized `rt-debug`. `rt-authors-300m` is the block of the
authors' released code (geniucos/recurrent-transformer, olmo/model.py with configs/kempner/base-c4-t5.yaml)
at the 300M-12L shape their loaded configs/kempner/models/300m_12.yaml gives (width 1440, 16 heads of
90, MLP 5,760), with `rt-authors-debug` its CPU-sized sibling. `DENSE_FLAVOURS` are the SPEC shapes'
parameter-matched dense partners, gpt2 family flavours with the same block options and shapes
(registered by rgpt_dist.models.gpt2).

Block options beyond the shared ones, each default our reading of SPEC section 9 (the source of each
default and the authors' value: docs/families.md, the RT section): residual_scale, qk_norm_span,
qk_norm_type, init_scheme, gelu, alibi_slopes.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from rgpt_dist.sections import out_of_bounds
from rgpt_dist.models.config import MAX_BLOCKS, ModelConfig

PREFILLS = ("tiled", "naive")
"""How a full-sequence forward runs the per-layer recurrence (rgpt_dist.models.rt.tiled)."""
CHOICES: dict[str, tuple[str, ...]] = {
    "residual_scale": ("inv_sqrt_l", "none"), "qk_norm_span": ("head", "width"),
    "qk_norm_type": ("rmsnorm", "layernorm"), "init_scheme": ("normal", "authors"),
    "gelu": ("tanh", "exact"), "alibi_slopes": ("press", "geometric"),
}
"""The RT block options' values, the default first (rt.model reads them; it cannot import this module,
which an export replaces by its config: rt.model.OPTIONS repeats them and a test checks they agree)."""


@dataclasses.dataclass
class RTConfig(ModelConfig):
    """Layerwise Recurrent Transformer: n_layer RT layers (pre-norm attention over the persistent
    pairs of earlier positions plus a temporary pair, a GELU MLP, residual branches scaled by
    1/sqrt(n_layer) by default), a final norm and a head (untied by default, as the authors')."""

    family: str = "rt"
    """Model family (fixed for this class)."""
    n_layer: int = 12
    """L: RT layers, each with its own weights; 1 <= n_layer <= 1024. Residual branches are scaled
    by 1/sqrt(L) (residual_scale)."""
    bias: bool = False
    """Biases in linear layers (and LayerNorms with norm=layernorm); the authors' model has none."""
    norm: str = "rmsnorm"
    """Every normalisation over d (`rmsnorm`, SPEC section 9's RMS; or `layernorm`, with a bias only
    with `bias`: the authors' released code's LayerNorm with a gain and no bias); eps = ln_eps."""
    qk_norm: bool = True
    """QK-norm of queries and of both the temporary and the persistent keys (the authors' and SPEC's);
    False: none. Its span and normalisation: qk_norm_span, qk_norm_type (default: per head, RMS)."""
    pos_encoding: str = "alibi"
    """`alibi` (the authors': slope_h x distance subtracted from each logit, the temporary pair at
    distance 0), `rope` (q, the temporary and the persistent key of position t rotated at t),
    `learned` (GPT-2's wpe added to the token embedding) or `none`."""
    mlp: str = "gelu"
    """The MLP (`gelu`, 4 d by default: the authors'; `swiglu` with d_ff given)."""
    tie_embeddings: bool = False
    """Whether the head reuses the token embedding (False: a separate V x d head matrix, the
    authors'; it adds padded_vocab_size x d_model parameters and no FLOPs)."""
    residual_scale: Literal["inv_sqrt_l", "none"] = "inv_sqrt_l"
    """What multiplies each residual branch: `inv_sqrt_l` (1/sqrt(L), SPEC section 9's z_t = x_t + (a_t +
    MLP(RMS(x_t + a_t / sqrt(L)))) / sqrt(L)) or `none` (x + a, then + MLP(norm(x + a)): the authors'
    released block, which scales no branch)."""
    qk_norm_span: Literal["head", "width"] = "head"
    """What QK-norm normalises over (with qk_norm): `head` (each head's head_dim features, one gain of
    head_dim shared by the heads) or `width` (all d features of q, and of k, at once, a gain of d: the
    authors' code, whose q_norm and k_norm have size d_model). `width` needs every head's features on
    one rank: refused under tensor parallelism (parallel.tp_size > 1)."""
    qk_norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    """QK-norm's normalisation (with qk_norm): `rmsnorm` (a gain) or `layernorm` (mean removed, a gain,
    a bias only with `bias`: the authors' code builds its QK-norms with the layer_norm_type of its
    other norms, LayerNorm, and bias_for_layer_norm false). The other norms follow `norm`."""
    init_scheme: Literal["normal", "authors"] = "normal"
    """`normal`: N(0, init_std) for every matrix and embedding, the output maps too (GPT-2's, ours).
    `authors`: OLMo's `mitchell` init of the authors' configs, truncated at 3 standard deviations: q,
    kv, the MLP's input maps, wte and the head 1/sqrt(d); layer l's (0-based) attention output map
    1/sqrt(2 d (l + 1)) and MLP output map 1/sqrt(2 d_ff (l + 1)); biases 0, gains 1. init_std is
    then unused."""
    gelu: Literal["tanh", "exact"] = "tanh"
    """The GELU of mlp='gelu': `tanh` (GPT-2's approximation, the shared layers') or `exact`
    (x Phi(x): the authors' OLMo, torch's GELU(approximate='none')). Only `tanh` with mlp='swiglu'."""
    alibi_slopes: Literal["press", "geometric"] = "press"
    """ALiBi's head slopes (pos_encoding=alibi): `press` (Press et al.'s reference code: 2^(-8h/H) for
    H a power of two; otherwise the largest power of two's, then every other slope of twice that many)
    or `geometric` (2^(-8h/H) for h = 1..H whatever H: the authors' OLMo with alibi_bias_max 8). Equal
    when H is a power of two (16, 32); they differ at the 22 heads of width 1408."""
    prefill: Literal["tiled", "naive"] = "tiled"
    """Which full-sequence forward runs (training and a cache's prefill): `tiled` (rt.tiled.scan,
    Theta(N log N) key reads) or `naive` (rt.tiled.naive_scan, the per-position oracle, Theta(N^2));
    both compute the same function."""

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">=", 1, n_layer=self.n_layer)
        out += out_of_bounds(path, "<=", MAX_BLOCKS, n_layer=self.n_layer)
        if self.prefill not in PREFILLS:
            out.append(f"{path}.prefill={self.prefill!r} is not one of {', '.join(PREFILLS)}")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                out.append(f"{path}.{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if self.gelu != "tanh" and self.mlp == "swiglu":
            out.append(f"{path}.gelu={self.gelu!r} applies to mlp='gelu' only; mlp='swiglu' has no GELU "
                       "(leave gelu='tanh')")
        if self.mup_base_width:
            out.append(f"{path}.mup_base_width={self.mup_base_width} is not supported by RT (must be 0): its "
                       "layers and untied head have no muP scaling (the authors train at standard parametrisation)")
        return out


RT_BLOCK = {"bias": False, "norm": "rmsnorm", "qk_norm": True, "pos_encoding": "alibi", "mlp": "gelu"}
"""SPEC section 9's block (our reading of it; the other RT options at their defaults): no biases, RMSNorm,
QK-norm, ALiBi, GELU MLP 4 d."""

SHAPES: dict[str, tuple[int, int]] = {
    "150m-12l": (12, 1024), "150m-6l": (6, 1408),
    "300m-24l": (24, 1024), "300m-12l": (12, 1408), "300m-6l": (6, 2048),
}
"""The authors' settings: name -> (layers, width); heads = width / 64 (their configs)."""


def _shape(n_layer: int, d_model: int) -> dict:
    return {**RT_BLOCK, "d_model": d_model, "n_head": d_model // 64, "n_layer": n_layer}


DEBUG = {**RT_BLOCK, "d_model": 64, "n_head": 4, "n_layer": 3}
"""CPU-sized: width 64, 4 heads (head_dim 16), 3 layers."""

AUTHORS_BLOCK = {**RT_BLOCK, "norm": "layernorm", "qk_norm_type": "layernorm", "qk_norm_span": "width",
                 "residual_scale": "none", "init_scheme": "authors", "gelu": "exact", "alibi_slopes": "geometric"}
"""The authors' released block (olmo/model.py, OLMoRecurrentBlockTiled, with base-c4-t5.yaml's model
section): LayerNorm with a gain and no bias everywhere (layer_norm_type default, bias_for_layer_norm
false), QK-norm over the full width, no residual scaling, OLMo's `mitchell` init, exact GELU, ALiBi
slopes 2^(-8h/H); no biases, untied head, MLP 4 d (their mlp_hidden_size)."""
AUTHORS_300M = {**AUTHORS_BLOCK, "d_model": 1440, "n_head": 16, "n_layer": 12}
"""Their loaded configs/kempner/models/300m_12.yaml: d_model 1440, n_heads 16 (head_dim 90),
mlp_hidden_size 5760 (= 4 d), 12 layers; their README's table says 1408 / 22 / 5632 (SPEC's shape)."""
AUTHORS_DEBUG = {**AUTHORS_BLOCK, "d_model": 48, "n_head": 6, "n_layer": 3}
"""CPU-sized: width 48, 6 heads of 8 (6 is not a power of two, so the geometric slopes differ from
Press et al.'s), 3 layers."""

FLAVOURS: dict[str, dict] = {
    **{f"rt-{name}": {"family": "rt", **_shape(*s), "tie_embeddings": False} for name, s in SHAPES.items()},
    "rt-debug": {"family": "rt", **DEBUG, "tie_embeddings": False},
    "rt-authors-300m": {"family": "rt", **AUTHORS_300M, "tie_embeddings": False},
    "rt-authors-debug": {"family": "rt", **AUTHORS_DEBUG, "tie_embeddings": False},
}
"""Named RT sizes (model-section mappings, family included)."""

DENSE_FLAVOURS: dict[str, dict] = {
    **{f"rt-dense-{name}": {"family": "gpt2", **_shape(*s)} for name, s in SHAPES.items()},
    "rt-dense-debug": {"family": "gpt2", **DEBUG},
}
"""The dense partners: gpt2-family flavours with the same block options and shapes. An RT layer has
exactly a Transformer block's parameters (the persistent pair reuses the layer's K, V and norms), so
each partner matches its RT flavour but for the head: ours ties it to the embedding, RT's is untied
(padded_vocab_size x d_model more in RT)."""
