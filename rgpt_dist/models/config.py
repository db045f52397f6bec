"""The model section's shared fields; each family subclasses it in its own folder
(rgpt_dist/models/<family>/config.py), selected by `family`. No torch import."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from rgpt_dist.sections import Section, out_of_bounds
from rgpt_dist.models.spec import all_specs

# Upper bounds on sizes: generous, but finite, so that a typo (d_model=2^20: a 50k x 1M embedding
# alone is 200 GB) fails at validation, naming the value, instead of as an allocation failure later.
MAX_VOCAB = 2**20
MAX_PAD_MULTIPLE = 2**16
MAX_BLOCK_SIZE = 2**20
MAX_WIDTH = 2**16
POS_ENCODINGS = ("learned", "rope", "alibi", "none")
"""model.pos_encoding values (rgpt_dist.models.layers applies them; docs/models.md)."""
NORMS = ("layernorm", "rmsnorm")
"""model.norm values (as rgpt_dist.models.layers.NORMS)."""
MLPS = ("gelu", "swiglu")
"""model.mlp values (as rgpt_dist.models.layers.MLPS)."""
MAX_FFN = 2**18
"""Upper bound of model.d_ff (4 x MAX_WIDTH)."""
MAX_BLOCKS = 1024
"""Transformer blocks a model may hold (checked for every family, e.g. gpt2's n_layer, in
Config.problems) and the bound of each of n_pre, n_rec, n_coda and n_loops."""


@dataclasses.dataclass
class ModelConfig(Section):
    """Fields shared by every transformer family; `family` selects the concrete class. Every family
    holds at most MAX_BLOCKS (1024) unique transformer blocks (Config.problems checks it)."""

    variant_key: ClassVar[str] = "family"

    family: str = ""
    """Model family: the name of a registered family (rgpt_dist.models.<family>/, see docs/families.md)."""
    vocab_size: int = 50257
    """Tokenizer vocabulary size (GPT-2 BPE: 50,257 with <|endoftext|> = 50256); 1 <= vocab_size <= 2^20."""
    pad_vocab_multiple: int = 1
    """Embedding/LM-head rows are vocab_size rounded up to this multiple (64 or 128 speeds up the
    head on GPUs and makes the vocabulary divisible by the tensor-parallel size); 1 = no padding;
    1 <= pad_vocab_multiple <= 2^16."""
    block_size: int = 1024
    """Maximum sequence length: rows of the learned position embedding; 1 <= block_size <= 2^20. With
    another pos_encoding nothing in the layers depends on it: a forward may run longer sequences (a
    KV cache still holds at most block_size tokens)."""
    d_model: int = 768
    """Residual stream width d; 1 <= d_model <= 2^16 (65,536)."""
    n_head: int = 12
    """Attention heads; d_model must be divisible by it (so 1 <= n_head <= d_model)."""
    bias: bool = True
    """Biases in linear layers and LayerNorms (GPT-2 has them)."""
    ln_eps: float = 1e-5
    """LayerNorm epsilon; finite, > 0."""
    init_std: float = 0.02
    """Standard deviation of the normal init of linear and embedding weights (GPT-2: 0.02); finite, > 0."""
    pos_encoding: str = "learned"
    """How attention knows token positions: `learned` (GPT-2's absolute embedding wpe, block_size rows:
    no position past block_size - 1), `rope` (rotary q/k per head), `alibi` (per-head linear bias on
    the attention logits) or `none` (causal masking only). Only `learned` has a wpe parameter."""
    rope_base: float = 10000.0
    """RoPE's frequency base (pair i of a head rotates by position x base^(-2i/head_dim)); finite, > 1.
    Read only with pos_encoding=rope."""
    norm: str = "layernorm"
    """Every normalisation over d (blocks' two, the final one, and a family's own): `layernorm`
    (GPT-2's, with a bias when `bias`) or `rmsnorm` (a gain only, never a bias); eps = ln_eps."""
    mlp: str = "gelu"
    """The block's feed-forward: `gelu` (d -> d_ff -> d, tanh GELU; GPT-2) or `swiglu` (down(silu(gate
    x) * up x): three d x d_ff matrices)."""
    d_ff: int = 0
    """The feed-forward's hidden width; 0 <= d_ff <= 2^18. 0 = 4 d_model, for gelu only (swiglu
    needs it given, e.g. the RLT paper's 1,365 at d_model 512)."""
    qk_norm: bool = False
    """RMS-normalise each head's q and k over head_dim (a gain of head_dim features for q and one
    for k, shared by the heads) before RoPE."""
    mup_base_width: int = 0
    """Width-muP (Tensor Programs V, for Adam) with base width d_0, m = d_model / d_0: hidden
    matrices (qkv, attention out, MLP) init std / sqrt(m) and learning rate lr / m, logits x 1 / m,
    attention scale sqrt(head_dim / m) / head_dim. 0 = off (standard parametrisation; so is m = 1);
    0 <= mup_base_width <= 2^16, a multiple of n_head."""

    @classmethod
    def variants(cls) -> dict[str, type[Section]]:
        """Every registered config class, families and task models (rgpt_dist.models.spec discovers them)."""
        return {name: spec.config for name, spec in all_specs().items()}

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_multiple
        return -(-self.vocab_size // m) * m if m > 0 else self.vocab_size

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def ffn_width(self) -> int:
        """The feed-forward's hidden width: d_ff, or 4 d_model when d_ff is 0."""
        return self.d_ff or 4 * self.d_model

    def problems(self, path: str) -> list[str]:
        out = out_of_bounds(path, ">", 0, vocab_size=self.vocab_size, block_size=self.block_size, d_model=self.d_model,
                        n_head=self.n_head, ln_eps=self.ln_eps, init_std=self.init_std)
        out += out_of_bounds(path, ">=", 1, pad_vocab_multiple=self.pad_vocab_multiple)
        out += out_of_bounds(path, "<=", MAX_VOCAB, vocab_size=self.vocab_size)
        out += out_of_bounds(path, "<=", MAX_PAD_MULTIPLE, pad_vocab_multiple=self.pad_vocab_multiple)
        out += out_of_bounds(path, "<=", MAX_BLOCK_SIZE, block_size=self.block_size)
        out += out_of_bounds(path, "<=", MAX_WIDTH, d_model=self.d_model)
        if self.n_head > 0 and self.d_model % self.n_head:
            out.append(f"{path}.d_model={self.d_model} is not divisible by {path}.n_head={self.n_head}")
        if self.pos_encoding not in POS_ENCODINGS:
            out.append(f"{path}.pos_encoding={self.pos_encoding!r} is not one of {', '.join(POS_ENCODINGS)}")
        out += out_of_bounds(path, ">", 1, rope_base=self.rope_base)
        if self.pos_encoding == "rope" and self.n_head > 0 and self.d_model % self.n_head == 0 and self.head_dim % 2:
            out.append(f"{path}.pos_encoding='rope' rotates pairs of features: head_dim = d_model / n_head = "
                       f"{self.head_dim} must be even")
        return out + self._block_problems(path)

    def _block_problems(self, path: str) -> list[str]:
        """norm, mlp, d_ff, mup_base_width (qk_norm's gain is head_dim wide: nothing to check)."""
        out = [f"{path}.{name}={value!r} is not one of {', '.join(allowed)}"
               for name, value, allowed in (("norm", self.norm, NORMS), ("mlp", self.mlp, MLPS)) if value not in allowed]
        out += out_of_bounds(path, ">=", 0, d_ff=self.d_ff, mup_base_width=self.mup_base_width)
        out += out_of_bounds(path, "<=", MAX_FFN, d_ff=self.d_ff)
        out += out_of_bounds(path, "<=", MAX_WIDTH, mup_base_width=self.mup_base_width)
        if self.mlp == "swiglu" and self.d_ff == 0:
            out.append(f"{path}.mlp='swiglu' needs {path}.d_ff > 0 (d_ff=0 means 4 x d_model for gelu only)")
        if self.mup_base_width > 0 and self.n_head > 0 and self.mup_base_width % self.n_head:
            out.append(f"{path}.mup_base_width={self.mup_base_width} is not divisible by {path}.n_head={self.n_head} "
                       "(muP's base head_dim = mup_base_width / n_head)")
        return out


@dataclasses.dataclass
class LoopedConfig(ModelConfig):
    """The prelude / shared core / coda shape the recurrent families share (SPEC sections 1 and 4):
    n_pre blocks once, n_rec shared blocks applied r times, n_coda blocks once, final LN, tied head."""

    n_pre: int = 1
    """Prelude blocks, applied once; 0 <= n_pre <= 1024."""
    n_rec: int = 1
    """Blocks of the shared core, applied r times with the same weights; 1 <= n_rec <= 1024."""
    n_coda: int = 1
    """Coda blocks, applied once to the final state; 0 <= n_coda <= 1024."""
    n_loops: int = 10
    """R: the recurrence depth of training (its maximum or mean, as the family's sampler says) and the
    default depth at evaluation; 1 <= n_loops <= 1024."""

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">", 0, n_rec=self.n_rec)
        out += out_of_bounds(path, ">=", 0, n_pre=self.n_pre, n_coda=self.n_coda)
        if self.n_loops < 1:
            out.append(f"{path}.n_loops={self.n_loops} must be >= 1 (R is the recurrence depth)")
        out += out_of_bounds(path, "<=", MAX_BLOCKS, n_pre=self.n_pre, n_rec=self.n_rec, n_coda=self.n_coda,
                             n_loops=self.n_loops)
        return out
