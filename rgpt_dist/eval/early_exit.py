"""Validation loss against recurrence depth: the early-exit curve (paper Fig. 3).

One `all_exits` forward at the largest depth asked for gives the loss of coda + head applied to
every h^(k), k = 0..r_max, so the whole curve (prelude only, early exits, R, extrapolation beyond R)
costs one pass per batch. Each depth is reported with its inference FLOPs per token: Eq. 1 at that
depth plus the LM head (rgpt_dist.flops), the x axis of the paper's loss-vs-compute plot.
A dense model has one point (its depth is fixed).
"""
from __future__ import annotations

import csv
import math
import tempfile
from pathlib import Path

import numpy as np
import torch

from rgpt_dist.data.index import DatasetError
from rgpt_dist.data.samples import read_token_samples
from rgpt_dist import strict_json
from rgpt_dist.eval.finite import nonfinite_weights
from rgpt_dist.flops import executed_forward_flops, forward_flops, head_flops
from rgpt_dist.models.spec import spec_for
from rgpt_dist.progress import bar
from matplotlib.figure import Figure


def val_batches(paths: list[str], split: str, batch_size: int, max_batches: int,
                vocab_size: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first max_batches x batch_size samples of `split` in file order (no shuffling, no
    process group): (inputs, targets), each (batch_size, seq_len). Indexes are checked before any
    shard is read; compressed shards are decompressed into a private temporary directory."""
    samples: list[np.ndarray] = []
    with tempfile.TemporaryDirectory(prefix="rgpt-eval-") as scratch:  # created 0700
        for root in paths:
            samples += read_token_samples(Path(root) / split, batch_size * max_batches - len(samples), scratch,
                                          vocab_size)  # shards checked whole: offsets, token ids < vocab_size
    if len({len(s) for s in samples}) > 1:
        raise DatasetError(f"{paths}: datasets of different sequence lengths ({sorted({len(s) - 1 for s in samples})})")
    n = len(samples) // batch_size * batch_size
    if n == 0:
        raise ValueError(f"split {split!r} of {paths} has fewer than batch_size={batch_size} samples")
    tokens = torch.from_numpy(np.stack(samples[:n]).astype(np.int64))    # (n, seq_len + 1)
    return [(b[:, :-1], b[:, 1:]) for b in tokens.split(batch_size)]


MAX_DEPTH_FACTOR = 16
"""The deepest depth evaluated is at most 16 x the trained depth R (n_loops), for families that allow
extrapolation at all: one forward runs every step up to the deepest depth asked for, so a depth far
beyond R (a typo, or a crafted export) would run for hours for no finding. Ask for depths within it."""


def _check_depths(depths: list, cfg, spec, deepest: int | None) -> None:
    """ValueError naming the depths that are not integers in 0..bound (the family's deepest, or
    MAX_DEPTH_FACTOR x R): a negative one would index the exits from the end."""
    bound = deepest if deepest is not None else MAX_DEPTH_FACTOR * cfg.n_loops
    bad = [d for d in depths if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= bound]
    if bad and deepest is not None and all(isinstance(d, int) and d > deepest for d in bad):
        raise ValueError(f"{spec.title} has no depth beyond r={deepest} ({spec.layout(cfg)}): asked for {bad}")
    if bad:
        why = f"{spec.title}'s deepest depth" if deepest is not None else \
            f"{MAX_DEPTH_FACTOR} x the trained depth R = {cfg.n_loops}"
        raise ValueError(f"depths {bad[:10]} are outside 0..{bound} ({why}; {spec.layout(cfg)}): pass depths within it")


@torch.no_grad()
def early_exit_curve(model: torch.nn.Module, batches: list, depths: list[int] | None) -> list[dict]:
    """One row per depth: loss, perplexity, FLOPs per token and `problem` (None; or the weights are not
    finite, named; or the loss is not finite because the activations overflow; JSON writes NaN as null).
    `depths` (recurrent models: any r >= 0 up to the family's max_eval_depth, or else up to
    MAX_DEPTH_FACTOR x R; default 0..2R or 0..max_eval_depth) is ignored for a dense model, which has
    one row with depth None."""
    model.eval()
    cfg, seq_len = model.cfg, batches[0][0].shape[1]
    spec = spec_for(cfg)
    recurrent, deepest = spec.recurrent, spec.max_eval_depth(cfg)
    if recurrent:
        default = range(2 * cfg.n_loops + 1 if deepest is None else min(2 * cfg.n_loops, deepest) + 1)
        depths = sorted(set(depths if depths is not None else default))
        _check_depths(depths, cfg, spec, deepest)
    else:
        depths = [None]
    totals = torch.zeros(len(depths), dtype=torch.float64)
    tokens = 0
    for x, y in bar(batches, desc="evaluation batches", unit="batch"):
        if recurrent:  # exit_losses: (r_max + 1,) mean loss of every exit 0..r_max
            exits = model(x, y, r=max(depths), all_exits=True).aux["exit_losses"].double().cpu()
            losses = exits[torch.tensor(depths)]
        else:
            losses = model(x, y).loss.double().reshape(1).cpu()
        n = int((y >= 0).sum())
        totals += losses * n
        tokens += n
    weights = nonfinite_weights(model)  # said on every row: even a finite loss is then no finding
    rows = []
    for depth, total in zip(depths, (totals / tokens).tolist()):
        problem = weights or (None if math.isfinite(total) else
                              "the loss is not finite: the activations overflow (the weights are finite)")
        rows.append({"depth": depth, "loss": total, "perplexity": math.exp(min(total, 50.0)),
                     "flops_per_token": forward_flops(cfg, seq_len, depth) + head_flops(cfg),
                     "executed_flops_per_token": executed_forward_flops(cfg, seq_len, depth) + head_flops(cfg),
                     "tokens": tokens, "train_depth": getattr(cfg, "n_loops", None), "problem": problem})
    return rows


def write_curve(rows: list[dict], out_dir: Path, title: str = "") -> list[Path]:
    """early_exit.csv, early_exit.json and early_exit.png (loss vs depth, loss vs FLOPs) in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "early_exit.csv", out_dir / "early_exit.json", out_dir / "early_exit.png"]
    with open(paths[0], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    paths[1].write_text(strict_json.dumps(rows, indent=1) + "\n")
    plot_curve(rows, paths[2], title)
    return paths


def plot_curve(rows: list[dict], path: Path, title: str = "") -> None:
    points = [r for r in rows if r["depth"] is not None] or rows
    depth = [r["depth"] if r["depth"] is not None else 0 for r in points]
    loss = [r["loss"] for r in points]
    gflops = [r["flops_per_token"] / 1e9 for r in points]
    fig = Figure(figsize=(10, 4))  # no pyplot: no global figure state
    a, b = fig.subplots(1, 2)
    a.plot(depth, loss, "o-")
    a.set(xlabel="recurrence depth R*", ylabel="validation loss", title="early exit / extrapolation")
    b.plot(gflops, loss, "o-")
    b.set(xlabel="inference GFLOPs per token (Eq. 1 + head)", ylabel="validation loss", title="loss vs compute")
    train_depth = points[0]["train_depth"]
    if train_depth is not None and points[0]["depth"] is not None:
        a.axvline(train_depth, color="grey", linestyle="--", label=f"training R = {train_depth}")
        a.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
