"""AdamW with the nanoGPT weight-decay convention and the paper's warmup + cosine schedule."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from rgpt_dist.config.train import TrainConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay tensors of 2 or more dimensions (matmul weights, embeddings); not biases or norm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup over warmup_steps (step 0 already > 0), then cosine from lr to min_lr at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    if step >= cfg.max_steps:
        return cfg.min_lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


class SkipNonFiniteAdamW(torch.optim.AdamW):
    """AdamW that skips the whole update, consistently on every rank, when any gradient is NaN/inf.

    DeepSpeed calls it at the accumulation boundary after reducing (and, with ZeRO, partitioning)
    the gradients; each rank checks the gradients it holds and one MAX all-reduce makes the decision
    global, so parameters and optimizer states stay untouched everywhere (bf16 and fp32 have no loss
    scaler to do this)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last_skipped, self.skipped_total = False, 0

    @torch.no_grad()
    def step(self, closure=None):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        device = grads[0].device if grads else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        bad = torch.zeros((), device=device)
        if grads:
            bad = (~torch.stack([torch.isfinite(g).all() for g in grads])).any().float()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        self.last_skipped = bool(bad.item())
        if self.last_skipped:
            self.skipped_total += 1
            return None
        return super().step(closure)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> SkipNonFiniteAdamW:
    """torch AdamW as DeepSpeed's client optimizer (DeepSpeed's CPU Adam would compile an op first)."""
    return SkipNonFiniteAdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                              eps=1e-8)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Stepped once per optimizer step (by the DeepSpeed engine)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, cfg) / cfg.lr)
