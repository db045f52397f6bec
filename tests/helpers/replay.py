"""A finished one-process run trained again in a plain torch loop, without DeepSpeed, optionally in
float64: the twin that measures what float32 rounding does to the run's trajectory on the host at
hand (tests/helpers/tolerance.py's reasoning, at trainer level). The seeded init; AdamW with the
run's groups and hyperparameters at lr_at(step); the same micro-batches (the run's loader on one
rank) at the same depths and noise keys; the mean loss over the micro-batches; the global norm
clipped at train.grad_clip; the evaluations the run made, on its validation batches."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class Replay:
    weights: dict[str, torch.Tensor]
    losses: list[float]  # per step: the mean over its micro-batches
    grad_norms: list[float]  # per step: the global norm before clipping
    evaluations: dict[int, list[float]] = field(default_factory=dict)  # step -> [val_loss, *early_exit]


def replay(run_dir: str | Path, dtype: torch.dtype = torch.float32) -> Replay:
    from rgpt_dist.config import load_config
    from rgpt_dist.depth import step_depths
    from rgpt_dist.models.spec import spec_for
    from rgpt_dist.noise import NoiseKey
    from rgpt_dist.parallel.dims import ParallelDims
    from rgpt_dist.registry import build_model
    from rgpt_dist.train.optim import lr_at, param_groups
    from rgpt_dist.train.run import _loaders

    cfg = load_config(Path(run_dir) / "config.yaml")
    t = cfg.train
    assert cfg.parallel.tp_size == 1 and cfg.parallel.dtype == "fp32" and cfg.parallel.compile_mode() == "none"
    model = build_model(cfg.model, seed=t.seed).to(dtype).train()
    opt = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, betas=(t.beta1, t.beta2), eps=1e-8)
    sampler, accum = spec_for(cfg.model).depth_sampler(cfg.model), t.grad_accum_steps(1)
    train, val = _loaders(cfg, ParallelDims(world=1, tp=1, rank=0, local_rank=0))
    batches = iter(train)
    out = Replay({}, [], [])
    for step in range(t.max_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, t)
        total = 0.0
        for micro, r in enumerate(step_depths(sampler, t.seed, step, accum)):
            x, y = next(batches)
            res = model(x, y, r=r, noise_key=NoiseKey(t.seed, step, micro, 0))
            ((res.loss + res.aux.get("aux_loss", 0.0)) / accum).backward()
            total += res.loss.item() / accum
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
        if t.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.losses.append(total)
        out.grad_norms.append(norm)
        every = cfg.eval.every_steps
        if every and ((step + 1) % every == 0 or step + 1 == t.max_steps):
            out.evaluations[step + 1] = _evaluate(model, val, cfg.eval.early_exit and sampler is not None)
    out.weights = {k: v.detach() for k, v in model.state_dict().items()}
    return out


@torch.no_grad()
def _evaluate(model, val_batches, exits: bool) -> list[float]:
    """The trainer's evaluation on one rank: the mean loss over the batches, then the mean early-exit
    curve."""
    model.eval()
    losses, curves = [], []
    for x, y in val_batches:
        res = model(x, y, all_exits=exits)
        losses.append(res.loss.item())
        if exits:
            curves.append(res.aux["exit_losses"].double())
    model.train()
    return [sum(losses) / len(losses)] + (torch.stack(curves).mean(0).tolist() if curves else [])


def twin_bounds(records: list[dict], twin: Replay) -> tuple[float, float]:
    """(rel, grad_norm_rel) for tests.helpers.runs.assert_same_training against the float32 run whose
    metrics are `records`, from its float64 replay `twin`: 4x the run's largest relative distance
    from the twin (losses and evaluations; gradient norms apart) plus 4 float32 ulps."""
    from tests.helpers.tolerance import EPS32

    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, len(twin.losses) + 1))

    def rel(pairs) -> float:
        return max(abs(a - b) / abs(b) for a, b in pairs)

    values = [(r["loss"], twin.losses[r["step"] - 1]) for r in train]
    for r in (r for r in records if "val_loss" in r):
        values += list(zip([r["val_loss"], *r.get("early_exit", [])], twin.evaluations[r["step"]]))
    norms = [(r["grad_norm"], twin.grad_norms[r["step"] - 1]) for r in train]
    return 4 * rel(values) + 4 * EPS32, 4 * rel(norms) + 4 * EPS32
