"""Per-token exits at a threshold, for families that learn when to stop (Ouro's exit gate): the loss
of every token at the iteration it leaves, the depths it leaves at, and the compute those exits
spend, per threshold q. Written by `rgpt-eval curve` beside the fixed-depth curve."""
from __future__ import annotations

import csv
from pathlib import Path

import torch

from rgpt_dist import strict_json
from rgpt_dist.models.spec import spec_for


@torch.no_grad()
def threshold_exit_rows(model: torch.nn.Module, batches: list, thresholds: list[float]) -> list[dict]:
    """One row per q: mean loss at the exits, mean and histogram of the exit depth (1..R), and the
    forward FLOPs per token they spend (the spec's exit_flops averaged over the tokens), beside the
    fixed-depth forward at R."""
    model.eval()
    cfg, seq_len = model.cfg, batches[0][0].shape[1]
    spec = spec_for(cfg)
    if not spec.learned_exit:
        raise ValueError(f"{spec.title} has no learned exit: per-token exit thresholds do not apply")
    R = spec.default_depth(cfg)
    full = spec.exit_flops(cfg, seq_len, R)
    loss_sums = [0.0] * len(thresholds)
    counts = [torch.zeros(R + 1, dtype=torch.float64) for _ in thresholds]
    for x, y in batches:  # one pass through the iterations per batch serves every threshold
        valid = y >= 0
        for i, (depth, loss) in enumerate(model.exits_at_thresholds(x, y, thresholds)):
            loss_sums[i] += float(loss[valid].double().sum())
            counts[i] += torch.bincount(depth[valid].cpu(), minlength=R + 1).double()
    rows = []
    for q, loss_sum, count in zip(thresholds, loss_sums, counts):
        n = float(count.sum())
        flops = sum(float(c) * spec.exit_flops(cfg, seq_len, t) for t, c in enumerate(count) if c) / n
        rows.append({"threshold": q, "loss": loss_sum / n, "mean_depth": float((count * torch.arange(R + 1)).sum()) / n,
                     "depth_fraction": (count[1:] / n).tolist(), "flops_per_token": flops,
                     "flops_vs_depth_R": flops / full, "tokens": int(n), "train_depth": R})
    return rows


def write_threshold_exits(rows: list[dict], out_dir: Path) -> list[Path]:
    """exit_threshold.csv (depth fractions as one column each) and exit_threshold.json in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "exit_threshold.csv", out_dir / "exit_threshold.json"]
    flat = [{**{k: v for k, v in row.items() if k != "depth_fraction"},
             **{f"exit_at_{t + 1}": f for t, f in enumerate(row["depth_fraction"])}} for row in rows]
    with open(paths[0], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(flat[0]))
        writer.writeheader()
        writer.writerows(flat)
    paths[1].write_text(strict_json.dumps(rows, indent=1) + "\n")  # NaN -> null
    return paths
