"""AdamW with the nanoGPT weight-decay convention and the paper's warmup + cosine schedule.

Width-muP (model.mup_base_width, Tensor Programs V's Adam rule): the layers tag the modules whose
matrices are hidden weights (`mup_lr_scale` = 1 / m, rgpt_dist.models.layers); their >= 2-D
parameters form groups of their own whose learning rate is lr / m. The schedule multiplies every
group's own lr by the same factor (LambdaLR keeps each group's initial lr), so its shape is kept and
the hidden groups run at 1 / m of it throughout (min_lr included); AdamW's decoupled decay reads the
group's lr too, as in the `mup` package's MuAdamW. DeepSpeed steps this client scheduler and never
sets group learning rates itself; its reported lr (`get_lr()[0]`) is the first group's, the
unscaled one."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from rgpt_dist.config.train import TrainConfig
from rgpt_dist.parallel.deepspeed_lib import is_model_parallel_parameter


def _lr_scales(model: torch.nn.Module) -> dict[int, float]:
    """id(parameter) -> muP lr scale, for every >= 2-D parameter under a module tagged `mup_lr_scale`."""
    scales = {}
    for module in model.modules():
        scale = getattr(module, "mup_lr_scale", None)
        if scale is not None:
            scales.update({id(p): scale for p in module.parameters() if p.dim() >= 2})
    return scales


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay tensors of 2 or more dimensions (matmul weights, embeddings); not biases or norm gains.
    Under muP the hidden matrices come last, one group per lr scale (its key `lr_scale`); without
    muP exactly the two groups above."""
    params = [p for p in model.parameters() if p.requires_grad]
    scales = _lr_scales(model)
    groups = [{"params": [p for p in params if p.dim() >= 2 and id(p) not in scales], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    for scale in sorted(set(scales.values())):
        groups.append({"params": [p for p in params if scales.get(id(p)) == scale], "weight_decay": weight_decay,
                       "lr_scale": scale})
    return groups


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
    groups = param_groups(model, cfg.weight_decay)
    for group in groups:
        if "lr_scale" in group:  # muP's hidden matrices: lr / m
            group["lr"] = cfg.lr * group["lr_scale"]
    return SkipNonFiniteAdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Stepped once per optimizer step (by the DeepSpeed engine); every group's lr is its initial lr
    (cfg.lr, or lr / m for muP's hidden matrices) x lr_at(step) / cfg.lr."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, cfg) / cfg.lr)


def apply_config(optimizer: torch.optim.Optimizer, scheduler, cfg: TrainConfig) -> None:
    """After a resume, the config's lr, betas, epsilon and weight decay replace those the checkpoint
    carried: torch's load_state_dict restores every group's hyperparameters and LambdaLR's base_lrs,
    which would silently keep the old peak lr (the lambda alone follows the new schedule). The no-decay
    group (param_groups' second) keeps 0; the next step's lr is the new schedule's at the step reached."""
    bases = [cfg.lr * group.get("lr_scale", 1.0) for group in optimizer.param_groups]
    for i, (group, base) in enumerate(zip(optimizer.param_groups, bases)):
        group.update(betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, initial_lr=base,
                     weight_decay=0.0 if i == 1 else cfg.weight_decay,
                     lr=base * lr_at(scheduler.last_epoch, cfg) / cfg.lr)
    scheduler.base_lrs = bases


@torch.no_grad()
def global_grad_norm(parameters, mpu=None) -> float:
    """The 2-norm of the whole model's gradient, before clipping, as DeepSpeed's fp32 clipping
    computes it (deepspeed.runtime.utils.clip_grad_norm_, whose result the engine drops at ZeRO-0),
    with one device sync instead of one per parameter, accumulated in float64. Call it after the reduction over data-parallel
    ranks, when every dp replica holds the same gradient. Under tensor parallelism (`mpu`: DeepSpeed's
    view of megatron's groups) sharded parameters (megatron marks them `tensor_model_parallel`) count
    on every tp rank and replicated ones (layer norms, row-parallel biases) on tp rank 0 only: counted
    on every rank they would inflate the norm. One SUM over all ranks then adds the tp shards and
    counts each dp replica once (divided by dp), so a NaN on any rank (the step is skipped
    everywhere) makes every rank's norm NaN, logged as null, like DeepSpeed's norm at ZeRO 1-3."""
    tp_rank, tp = (mpu.get_model_parallel_rank(), mpu.get_model_parallel_world_size()) if mpu is not None else (0, 1)
    grads = [p.grad for p in parameters if p.grad is not None and (tp_rank == 0 or is_model_parallel_parameter(p))]
    device = grads[0].device if grads else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    squares = torch.zeros((), dtype=torch.float64, device=device)
    if grads:  # in float64, as DeepSpeed's ZeRO optimizers: float32 was off by 4e-6 relative on CPU
        squares = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads]).square().sum()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(squares, op=dist.ReduceOp.SUM)
        squares /= dist.get_world_size() // tp  # the dp replicas' identical sums
    return squares.sqrt().item()


@torch.no_grad()
def clip_gradients(parameters, norm: float, max_norm: float) -> None:
    """Scale every gradient by min(1, max_norm / (norm + 1e-6)) (torch's and DeepSpeed's rule) given
    the global `norm` (global_grad_norm), through torch's clip_grads_with_norm_ (one foreach multiply
    per device and dtype). max_norm 0 is no clipping; a non-finite norm leaves the gradients alone:
    the step is skipped on every rank (SkipNonFiniteAdamW)."""
    if max_norm > 0 and math.isfinite(norm):
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, torch.tensor(norm, dtype=torch.float64))
