"""Training-recipe section (paper section 4, Table 5). No torch import."""
from __future__ import annotations

import dataclasses

from rgpt_dist.config.base import Section, out_of_bounds


@dataclasses.dataclass
class TrainConfig(Section):
    """Optimisation and batch shape; the defaults are the paper's recipe on one GPU."""

    seed: int = 1337
    """Seed of initialisation, depth sampling and noise (the paper's main seed is 1337)."""
    seq_len: int = 1024
    """Tokens per training sequence T; must not exceed model.block_size."""
    micro_batch_size: int = 8
    """Sequences per micro-batch per data-parallel rank."""
    global_batch_size: int = 480
    """Sequences per optimizer step over all ranks (paper: 8 x 60 = 480, 491,520 tokens). Gradient
    accumulation is derived: global_batch_size / (micro_batch_size x data-parallel ranks)."""
    max_steps: int = 20000
    """Optimizer steps (20,000 standard budget; 40,000 doubled)."""
    lr: float = 6e-4
    """Peak learning rate after warmup."""
    min_lr: float = 6e-5
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = 2000
    """Linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW weight decay, applied to tensors of 2 or more dimensions only."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables clipping."""
    max_nonfinite_steps: int = 5
    """Consecutive optimizer steps with a non-finite loss or gradient norm (each skipped on every
    rank) after which the run saves and stops."""

    def problems(self, path: str) -> list[str]:
        out = out_of_bounds(path, ">", 0, seq_len=self.seq_len, micro_batch_size=self.micro_batch_size,
                            global_batch_size=self.global_batch_size, max_steps=self.max_steps, lr=self.lr,
                            max_nonfinite_steps=self.max_nonfinite_steps)
        out += out_of_bounds(path, ">=", 0, min_lr=self.min_lr, warmup_steps=self.warmup_steps,
                             weight_decay=self.weight_decay, grad_clip=self.grad_clip)
        if self.min_lr > self.lr:
            out.append(f"{path}.min_lr={self.min_lr} must not exceed {path}.lr={self.lr}")
        if self.micro_batch_size > 0 and self.global_batch_size % self.micro_batch_size:
            out.append(f"{path}.global_batch_size={self.global_batch_size} is not a multiple of "
                       f"{path}.micro_batch_size={self.micro_batch_size}")
        if self.warmup_steps > self.max_steps:
            out.append(f"{path}.warmup_steps={self.warmup_steps} exceeds {path}.max_steps={self.max_steps}")
        for name, beta in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not 0 <= beta < 1:
                out.append(f"{path}.{name}={beta} must be in [0, 1)")
        return out

    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    def grad_accum_steps(self, dp_size: int) -> int:
        """Micro-batches per optimizer step on each of dp_size ranks (preflight checks divisibility)."""
        return self.global_batch_size // (self.micro_batch_size * dp_size)
