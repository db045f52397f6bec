"""Model sections: one dataclass per family, selected by `family`. No torch import."""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from rgpt_dist.config.base import Section, out_of_bounds


@dataclasses.dataclass
class ModelConfig(Section):
    """Fields shared by every transformer family; `family` selects the concrete class."""

    variant_key: ClassVar[str] = "family"

    family: str = ""
    """Model family: a key of `ModelConfig.variants()` (gpt2, recurrent_gpt)."""
    vocab_size: int = 50257
    """Tokenizer vocabulary size (GPT-2 BPE: 50,257 with <|endoftext|> = 50256)."""
    pad_vocab_multiple: int = 1
    """Embedding/LM-head rows are vocab_size rounded up to this multiple (64 or 128 speeds up the
    head on GPUs and makes the vocabulary divisible by the tensor-parallel size); 1 = no padding."""
    block_size: int = 1024
    """Maximum sequence length: rows of the learned position embedding."""
    d_model: int = 768
    """Residual stream width d."""
    n_head: int = 12
    """Attention heads; d_model must be divisible by it."""
    bias: bool = True
    """Biases in linear layers and LayerNorms (GPT-2 has them)."""
    ln_eps: float = 1e-5
    """LayerNorm epsilon."""
    init_std: float = 0.02
    """Standard deviation of the normal init of linear and embedding weights (GPT-2: 0.02)."""

    @classmethod
    def variants(cls) -> dict[str, type[Section]]:
        return {"gpt2": GPT2Config, "recurrent_gpt": RecurrentGPTConfig}

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_multiple
        return -(-self.vocab_size // m) * m if m > 0 else self.vocab_size

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def problems(self, path: str) -> list[str]:
        out = out_of_bounds(path, ">", 0, vocab_size=self.vocab_size, block_size=self.block_size, d_model=self.d_model,
                        n_head=self.n_head, ln_eps=self.ln_eps, init_std=self.init_std)
        out += out_of_bounds(path, ">=", 1, pad_vocab_multiple=self.pad_vocab_multiple)
        if self.n_head > 0 and self.d_model % self.n_head:
            out.append(f"{path}.d_model={self.d_model} is not divisible by {path}.n_head={self.n_head}")
        return out


@dataclasses.dataclass
class GPT2Config(ModelConfig):
    """Dense GPT-2 (pre-norm, GELU MLP 4d, learned positions, tied head): the baseline."""

    family: str = "gpt2"
    """Model family (fixed for this class)."""
    n_layer: int = 12
    """Transformer blocks."""

    def problems(self, path: str) -> list[str]:
        return super().problems(path) + out_of_bounds(path, ">", 0, n_layer=self.n_layer)


@dataclasses.dataclass
class RecurrentGPTConfig(ModelConfig):
    """RecurrentGPT: n_pre prelude blocks, n_rec shared blocks applied r times through the gated
    projection (SPEC section 1), n_coda coda blocks, final LN, tied head."""

    family: str = "recurrent_gpt"
    """Model family (fixed for this class)."""
    n_pre: int = 1
    """Prelude blocks, applied once."""
    n_rec: int = 1
    """Blocks of the shared core, applied r times with the same weights."""
    n_coda: int = 1
    """Coda blocks, applied once to the final state."""
    n_loops: int = 10
    """R: the maximum recurrence depth in training and the default depth at evaluation."""
    r_min: int = 1
    """Smallest depth the training sampler draws (Uniform{r_min..R})."""
    depth_sampler: Literal["uniform", "fixed"] = "uniform"
    """Training depth schedule: uniform = Uniform{r_min..R} per optimizer step; fixed = always R."""
    sigma_x: float = 0.1
    """Std of the state noise eps_x added to h^(r-1) before W_proj (training only)."""
    sigma_g: float = 0.1
    """Std of the per-scalar gate noise eps_g added to the gate logits (training only)."""
    tau: float = 1.0
    """Gate temperature: g = sigmoid(f_g(...) / tau + eps_g)."""
    gate_bias_init: float = 4.0
    """Initial bias of the gate MLP's second layer (+4 gives g = sigmoid(4) = 0.982 at init)."""

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">", 0, n_rec=self.n_rec, tau=self.tau)
        out += out_of_bounds(path, ">=", 0, n_pre=self.n_pre, n_coda=self.n_coda, sigma_x=self.sigma_x,
                             sigma_g=self.sigma_g)
        if self.n_loops < 1:
            out.append(f"{path}.n_loops={self.n_loops} must be >= 1 (R is the maximum recurrence depth)")
        if not 1 <= self.r_min <= max(self.n_loops, 1):
            out.append(f"{path}.r_min={self.r_min} must satisfy 1 <= r_min <= n_loops={self.n_loops}")
        return out

    def layout(self, r: int | None = None) -> str:
        """The paper's shorthand, e.g. '2+5x4+2'."""
        return f"{self.n_pre}+{self.n_rec}x{self.n_loops if r is None else r}+{self.n_coda}"
