"""The layerwise Recurrent Transformer's model section (torch-free) and its named sizes.

RT (SPEC section 9; the second abstract of shared/papers/related_abstracts.txt): a stack of n_layer
layers in which each layer attends to key/value pairs computed from its *own* outputs at earlier
positions (the persistent pairs) plus a temporary pair from the current input. rgpt_dist.models.rt
(the spec) and rgpt_dist.models.rt.model (the model) have the equations.

`FLAVOURS` are the authors' settings (geniucos/recurrent-transformer, configs/kempner/models: 150M:
12 x 1024 and 6 x 1408; 300M: 24 x 1024, 12 x 1408, 6 x 2048; head_dim 64 everywhere, i.e. their
16, 22, 16, 22 and 32 heads; GELU MLP 4 d) with our GPT-2 vocabulary (50,257) and an untied head,
plus the CPU-sized `rt-debug`. `DENSE_FLAVOURS` are their parameter-matched dense partners, gpt2
family flavours with the same block options and shapes (registered by rgpt_dist.models.gpt2).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from rgpt_dist.sections import out_of_bounds
from rgpt_dist.models.config import MAX_BLOCKS, ModelConfig

PREFILLS = ("tiled", "naive")
"""How a full-sequence forward runs the per-layer recurrence (rgpt_dist.models.rt.tiled)."""


@dataclasses.dataclass
class RTConfig(ModelConfig):
    """Layerwise Recurrent Transformer: n_layer RT layers (pre-norm attention over the persistent
    pairs of earlier positions plus a temporary pair, a GELU MLP, residual branches scaled by
    1/sqrt(n_layer)), a final norm and a head (untied by default, as the authors')."""

    family: str = "rt"
    """Model family (fixed for this class)."""
    n_layer: int = 12
    """L: RT layers, each with its own weights; 1 <= n_layer <= 1024. Residual branches are scaled
    by 1/sqrt(L)."""
    bias: bool = False
    """Biases in linear layers (and LayerNorms with norm=layernorm); the authors' model has none."""
    norm: str = "rmsnorm"
    """Every normalisation over d (`rmsnorm`, the authors', or `layernorm`); eps = ln_eps."""
    qk_norm: bool = True
    """Per-head RMSNorm of queries and of both the temporary and the persistent keys (the authors'
    QK-norm); False: none."""
    pos_encoding: str = "alibi"
    """`alibi` (the authors': slope_h x distance subtracted from each logit, the temporary pair at
    distance 0), `rope` (q, the temporary and the persistent key of position t rotated at t),
    `learned` (GPT-2's wpe added to the token embedding) or `none`."""
    mlp: str = "gelu"
    """The MLP (`gelu`, 4 d by default: the authors'; `swiglu` with d_ff given)."""
    tie_embeddings: bool = False
    """Whether the head reuses the token embedding (False: a separate V x d head matrix, the
    authors'; it adds padded_vocab_size x d_model parameters and no FLOPs)."""
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
        if self.mup_base_width:
            out.append(f"{path}.mup_base_width={self.mup_base_width} is not supported by RT (must be 0): its "
                       "layers and untied head have no muP scaling (the authors train at standard parametrisation)")
        return out


RT_BLOCK = {"bias": False, "norm": "rmsnorm", "qk_norm": True, "pos_encoding": "alibi", "mlp": "gelu"}
"""The authors' block options (SPEC section 9): no biases, RMSNorm, QK-norm, ALiBi, GELU MLP 4 d."""

SHAPES: dict[str, tuple[int, int]] = {
    "150m-12l": (12, 1024), "150m-6l": (6, 1408),
    "300m-24l": (24, 1024), "300m-12l": (12, 1408), "300m-6l": (6, 2048),
}
"""The authors' settings: name -> (layers, width); heads = width / 64 (their configs)."""


def _shape(n_layer: int, d_model: int) -> dict:
    return {**RT_BLOCK, "d_model": d_model, "n_head": d_model // 64, "n_layer": n_layer}


DEBUG = {**RT_BLOCK, "d_model": 64, "n_head": 4, "n_layer": 3}
"""CPU-sized: width 64, 4 heads (head_dim 16), 3 layers."""

FLAVOURS: dict[str, dict] = {
    **{f"rt-{name}": {"family": "rt", **_shape(*s), "tie_embeddings": False} for name, s in SHAPES.items()},
    "rt-debug": {"family": "rt", **DEBUG, "tie_embeddings": False},
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
