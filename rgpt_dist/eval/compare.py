"""The report of the CPU-scale Table 1 comparison (issue #14; its runs: rgpt_dist.studies.compare):
the grid table, the early-exit curves in one plot, and the spread of two seeds. `report` writes
OUT/compare.md (+ .json), OUT/grid.{md,csv,json} (rgpt_dist.eval.grid) and OUT/early_exit.png from the
runs' own records. No torch import.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rgpt_dist.eval import strict_json
from rgpt_dist.eval.grid import summarize, write_table
from rgpt_dist.eval.markdown import cell, code
from rgpt_dist.studies.compare import SPREAD_FAMILY, Run


def report(out_dir: str | Path, runs: list[Run]) -> dict[str, Path]:
    """compare.md and compare.json (one row per run, the seed spread), grid.{md,csv,json} and
    early_exit.png in out_dir, from the runs' own records."""
    out_dir = Path(out_dir)
    rows = {r["name"]: r for r in summarize(out_dir, stale_after_s=None)}
    table = [rows[run.name] for run in runs if run.name in rows]
    paths = dict(zip(("grid_md", "grid_csv", "grid_json"), write_table(table, out_dir)))
    spread = seed_spread(table)
    (out_dir / "compare.json").write_text(strict_json.dumps({"runs": table, "seed_spread": spread}, indent=1) + "\n")
    (out_dir / "compare.md").write_text(markdown(table, spread))
    plot_early_exit(table, out_dir / "early_exit.png")
    return {**paths, "md": out_dir / "compare.md", "json": out_dir / "compare.json", "png": out_dir / "early_exit.png"}


def seed_spread(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Validation losses of the spread model's seeds: each, their mean and max - min."""
    losses = {r["name"]: r["val_loss"] for r in rows if r["family"] == SPREAD_FAMILY and r["val_loss"] is not None}
    if len(losses) < 2:
        return None
    values = list(losses.values())
    return {"runs": losses, "mean": statistics.fmean(values), "range": max(values) - min(values)}


def markdown(rows: list[dict[str, Any]], spread: dict[str, Any] | None) -> str:
    head = ("| method | run | layout | params | train GFLOPs/token | tokens | val loss (R) | vs dense | "
            "early exit (r = 0..R) | status |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        delta = "" if r["delta_vs_dense"] is None else f"{r['delta_vs_dense']:+.4f}"
        loss = "" if r["val_loss"] is None else f"{r['val_loss']:.4f}"
        gflops = "" if r["train_flops_per_token"] is None else f"{r['train_flops_per_token'] / 1e9:.4f}"
        lines.append(f"| {cell(r['method'])} | {code(r['name'])} | {cell(r['layout'])} | "
                     f"{(r['params'] or 0) / 1e6:.2f}M | {gflops} | {r['tokens_seen'] or 0:,} | {loss} | {delta} | "
                     f"{cell(r['early_exit_str'] or '')} | {cell(r['status'])} |")
    text = head + "\n".join(lines) + "\n"
    if spread:
        seeds = ", ".join(f"{code(name)} {loss:.4f}" for name, loss in spread["runs"].items())
        text += (f"\nSeed spread ({SPREAD_FAMILY}): {seeds}; mean {spread['mean']:.4f}, max - min "
                 f"{spread['range']:.4f}. Differences between methods smaller than this are within "
                 f"run-to-run noise.\n")
    return text


def plot_early_exit(rows: list[dict[str, Any]], path: Path) -> None:
    """Validation loss at every exit depth of each depth-recurrent run, the dense run as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        if r["early_exit"]:
            ax.plot(range(len(r["early_exit"])), r["early_exit"], "o-", label=f"{r['method']} ({r['name']})")
        elif r["setting"] == "dense" and r["val_loss"] is not None:
            ax.axhline(r["val_loss"], color="grey", linestyle="--", label=f"{r['method']} ({r['name']})")
    ax.set(xlabel="exit depth r (0 = prelude into coda)", ylabel="validation loss",
           title="early exit, scaled-down small isoFLOPs cell")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
