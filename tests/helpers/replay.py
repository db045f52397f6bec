"""A finished run trained again in a plain torch loop in one process, without DeepSpeed, optionally
in float64: the twin that measures what float32 rounding does to the run's trajectory on the host
at hand (tests/helpers/tolerance.py's reasoning, at trainer level). The seeded init and the run's
loss normalisation (train.loss_norm); AdamW with the run's groups and hyperparameters at
lr_at(step) (times a muP group's lr_scale); the same micro-batches at the same depths and noise
keys; the mean loss over the micro-batches; the global norm clipped at train.grad_clip; the
evaluations the run made, on its validation batches.

A token run is replayed from the samples it logged (RGPT_SAMPLE_LOG=<run>/samples,
rgpt_dist/train/sample_log.py; tests.helpers.runs.train(..., log_samples=True)): replica k's
micro-batches, with replica k's noise keys, in one process; the gradient is the mean over all dp x accum
micro-batches, as the reduction over ranks makes it; an evaluation is the mean over the first
dp x eval.batches validation batches in file order (what the replicas read between them: each
sample holds seq_len tokens, so the mean of the replicas' means is the mean over those batches). A
task run (data.task, one rank) is replayed from the task's own loader."""
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
    from rgpt_dist.models.layers import LayerFactory
    from rgpt_dist.models.spec import spec_for
    from rgpt_dist.noise import NoiseKey
    from rgpt_dist.registry import build_model
    from rgpt_dist.train.optim import lr_at, param_groups
    from rgpt_dist.train.run import with_loss_norm

    cfg = load_config(Path(run_dir) / "config.yaml")
    t = cfg.train
    assert cfg.parallel.dtype == "fp32" and cfg.parallel.compile_mode() == "none"
    model = build_model(cfg.model, factory=with_loss_norm(LayerFactory(), cfg), seed=t.seed).to(dtype).train()
    opt = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, betas=(t.beta1, t.beta2), eps=1e-8)
    batches, val = _data(Path(run_dir), cfg)
    dp = len(batches)
    sampler, accum = spec_for(cfg.model).depth_sampler(cfg.model), t.grad_accum_steps(dp)
    out = Replay({}, [], [])
    for step in range(t.max_steps):
        for group in opt.param_groups:  # width-muP's hidden matrices at lr / m (train/optim.py)
            group["lr"] = lr_at(step, t) * group.get("lr_scale", 1.0)
        total = 0.0
        for k, replica in enumerate(batches):
            for micro, r in enumerate(step_depths(sampler, t.seed, step, accum)):
                x, y = next(replica)
                res = model(x, y, r=r, noise_key=NoiseKey(t.seed, step, micro, k))
                ((res.loss + res.aux.get("aux_loss", 0.0)) / (accum * dp)).backward()
                total += res.loss.item() / (accum * dp)
        # the norm accumulated in float64 (a float32 vector_norm of a 10M-element tensor is 3.6e-4 off
        # on CPU); clipped by max_norm / (norm + 1e-6) where that is below 1
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads]).square().sum().sqrt().item()
        if t.grad_clip and norm + 1e-6 > t.grad_clip:
            for g in grads:
                g.mul_(t.grad_clip / (norm + 1e-6))
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.losses.append(total)
        out.grad_norms.append(norm)
        every = cfg.eval.every_steps
        if every and ((step + 1) % every == 0 or step + 1 == t.max_steps):
            out.evaluations[step + 1] = _evaluate(model, val, cfg.eval.early_exit and sampler is not None)
    out.weights = {k: v.detach() for k, v in model.state_dict().items()}
    return out


def _data(run_dir: Path, cfg) -> tuple[list, list]:
    """(per replica an iterator over its training micro-batches, the validation batches). A task
    run: the task's loaders on one rank (no shared memory). A token run: the samples it logged,
    looked up in its training split and validation split read in file order with
    rgpt_dist.data.samples.read_token_samples, never through a streaming dataset (each one opened in the
    test process would stay registered in shared memory for the rest of the session)."""
    from rgpt_dist.parallel.dims import ParallelDims
    from rgpt_dist.train.run import _loaders

    if cfg.data.task:
        train, val = _loaders(cfg, ParallelDims(world=1, tp=1, rank=0, local_rank=0))
        return [iter(train)], val
    logged = _logged_micro_batches(run_dir / "samples", cfg)
    assert logged, f"{run_dir}: no samples logged (train it with RGPT_SAMPLE_LOG={run_dir / 'samples'})"
    micro, n = cfg.train.micro_batch_size, cfg.eval.batches * len(logged) if cfg.eval.every_steps else 0
    rows = [_pair(tokens) for tokens in _split(cfg, cfg.data.val_split, n * micro)] if n else []
    val = [tuple(torch.stack(col) for col in zip(*rows[i:i + micro])) for i in range(0, len(rows), micro)]
    return [iter(replica) for replica in logged], val


def _split(cfg, split: str, limit: int) -> list:
    import tempfile

    from rgpt_dist.data.samples import read_token_samples

    assert len(cfg.data.paths) == 1, "a replay reads one dataset"
    with tempfile.TemporaryDirectory() as scratch:
        return read_token_samples(Path(cfg.data.paths[0]) / split, limit, scratch)


def _pair(tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of one sample, as rgpt_dist.data.streaming.TokenDataset gives them."""
    import numpy as np

    x = torch.from_numpy(tokens.astype(np.int64))
    return x[:-1], x[1:]


def _logged_micro_batches(where: Path, cfg) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per replica (in rank order), its training micro-batches as (inputs, targets), looked up by the
    hashes the run logged (rgpt_dist/train/sample_log.py) in the training split; [] without a log."""
    import hashlib
    import json

    files = sorted(where.glob("rank*.jsonl"), key=lambda p: int(p.stem[4:])) if where.is_dir() else []
    if not files:
        return []
    by_hash = {}
    for x, y in map(_pair, _split(cfg, cfg.data.train_split, 1 << 30)):
        by_hash[hashlib.blake2b(x.numpy().tobytes(), digest_size=8).hexdigest()] = (x, y)
    replicas = []
    for path in files:
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert [rec["step"] for rec in lines] == sorted(rec["step"] for rec in lines), f"{path}: a resumed run"
        replicas.append([tuple(torch.stack(col) for col in zip(*(by_hash[i] for i in rec["ids"]))) for rec in lines])
    return replicas


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
