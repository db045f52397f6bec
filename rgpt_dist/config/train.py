"""Training-recipe section (paper section 4, Table 5). No torch import."""
from __future__ import annotations

import dataclasses
from typing import Literal

from rgpt_dist.sections import Section, out_of_bounds

# Upper bounds: generous, but finite, so that a typo (seq_len=1e9, lr=inf) fails at validation,
# naming the value, instead of as an allocation failure or a diverged run later.
MAX_SEED = 2**32 - 1
MAX_SEQ_LEN = 2**20
MAX_MICRO_BATCH = 2**16
MAX_GLOBAL_BATCH = 2**24
MAX_STEPS = 10**9
MAX_LR = 1.0


@dataclasses.dataclass
class TrainConfig(Section):
    """Optimisation and batch shape; the defaults are the paper's recipe on one GPU."""

    seed: int = 1337
    """Seed of initialisation, depth sampling, data order and noise (the paper's main seed is 1337);
    0 <= seed <= 2^32 - 1 (the range every generator in the stack accepts)."""
    seq_len: int = 1024
    """Tokens per training sequence T; 1 <= seq_len <= 2^20 (1,048,576) and <= model.block_size."""
    micro_batch_size: int = 8
    """Sequences per micro-batch per data-parallel rank; 1 <= micro_batch_size <= 2^16 (65,536)."""
    global_batch_size: int = 480
    """Sequences per optimizer step over all ranks (paper: 8 x 60 = 480, 491,520 tokens);
    1 <= global_batch_size <= 2^24 (16,777,216). Gradient accumulation is derived:
    global_batch_size / (micro_batch_size x data-parallel ranks)."""
    max_steps: int = 20000
    """Optimizer steps (20,000 standard budget; 40,000 doubled); 1 <= max_steps <= 10^9."""
    lr: float = 6e-4
    """Peak learning rate after warmup; finite, 0 < lr <= 1.0."""
    min_lr: float = 6e-5
    """Learning rate at the end of the cosine decay; finite, 0 <= min_lr <= lr."""
    warmup_steps: int = 2000
    """Linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW weight decay, applied to tensors of 2 or more dimensions only; finite, >= 0."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    adam_eps: float = 1e-8
    """AdamW epsilon (torch's default); finite, > 0. A larger one damps the updates of parameters whose
    gradients are near zero (a fitted task: docs/families.md, the RLT curriculum)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables clipping; finite, >= 0."""
    max_nonfinite_steps: int = 5
    """Consecutive optimizer steps with a non-finite loss or gradient norm (each skipped on every
    rank) after which the run saves and stops."""
    loss_norm: Literal["token", "example"] = "token"
    """How a micro-batch's token losses become its loss (LayerFactory.loss_weights): token = the mean
    over its scored tokens (language modelling, unchanged); example = the RLT paper's: each example's
    mean over its own scored tokens, then the mean over the micro-batch's examples that have one
    (algorithmic tasks, where an example scores 1 token or dozens); one of token, example."""

    def problems(self, path: str) -> list[str]:
        out = out_of_bounds(path, ">", 0, seq_len=self.seq_len, micro_batch_size=self.micro_batch_size,
                            global_batch_size=self.global_batch_size, max_steps=self.max_steps, lr=self.lr,
                            max_nonfinite_steps=self.max_nonfinite_steps, adam_eps=self.adam_eps)
        out += out_of_bounds(path, ">=", 0, seed=self.seed, min_lr=self.min_lr, warmup_steps=self.warmup_steps,
                             weight_decay=self.weight_decay, grad_clip=self.grad_clip)
        out += out_of_bounds(path, "<=", MAX_SEED, seed=self.seed)
        out += out_of_bounds(path, "<=", MAX_SEQ_LEN, seq_len=self.seq_len)
        out += out_of_bounds(path, "<=", MAX_MICRO_BATCH, micro_batch_size=self.micro_batch_size)
        out += out_of_bounds(path, "<=", MAX_GLOBAL_BATCH, global_batch_size=self.global_batch_size)
        out += out_of_bounds(path, "<=", MAX_STEPS, max_steps=self.max_steps)
        out += [p for p in out_of_bounds(path, "<=", MAX_LR, lr=self.lr) if p not in out]  # inf: said once
        if self.min_lr > self.lr:
            out.append(f"{path}.min_lr={self.min_lr} must not exceed {path}.lr={self.lr}")
        if self.micro_batch_size > 0 and self.global_batch_size % self.micro_batch_size:
            out.append(f"{path}.global_batch_size={self.global_batch_size} is not a multiple of "
                       f"{path}.micro_batch_size={self.micro_batch_size}")
        if self.warmup_steps > self.max_steps:
            out.append(f"{path}.warmup_steps={self.warmup_steps} exceeds {path}.max_steps={self.max_steps}")
        if self.loss_norm not in ("token", "example"):
            out.append(f"{path}.loss_norm={self.loss_norm!r} must be 'token' or 'example'")
        for name, beta in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not 0 <= beta < 1:
                out.append(f"{path}.{name}={beta} must be in [0, 1)")
        return out

    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    def grad_accum_steps(self, dp_size: int) -> int:
        """Micro-batches per optimizer step on each of dp_size ranks (preflight checks divisibility)."""
        return self.global_batch_size // (self.micro_batch_size * dp_size)
