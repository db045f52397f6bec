"""The report of the CPU-scale sequential ablation: ablations.md (the Fig. 5 table with deltas, and the
seeds; the tables: table.py), grid.{md,csv,json} and the bar chart ablation.png. No torch import.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from rgpt_dist.eval.grid import summarize, write_table
from rgpt_dist.studies.ablation.table import markdown, study_rows


def report(out_dir: str | Path) -> dict[str, Path]:
    """ablations.md (the Fig. 5 table with deltas, and the seeds), grid.{md,csv,json} and the bar
    chart ablation.png in out_dir, from the runs' own records."""
    out_dir = Path(out_dir)
    rows = summarize(out_dir, stale_after_s=None)
    paths = dict(zip(("grid_md", "grid_csv", "grid_json"), write_table(rows, out_dir)))
    md = markdown(rows) or "# Ablations\n\nNo ablation run has finished.\n"
    (out_dir / "ablations.md").write_text(md)
    plot(study_rows(rows, "fig5"), out_dir / "ablation.png")
    return {**paths, "md": out_dir / "ablations.md", "png": out_dir / "ablation.png"}


def plot(found: list[tuple[str, dict[str, Any]]], path: Path) -> None:
    """Fig. 5's bars: each row's validation loss, the dense baseline as a dashed line."""
    bars = [(label, r["val_loss"]) for label, r in found if not label.startswith("1-") and r["val_loss"] is not None]
    dense = next((r["val_loss"] for label, r in found if label.startswith("1-")), None)
    fig = Figure(figsize=(7, 4))  # no pyplot: no global figure state
    ax = fig.subplots()
    ax.bar([label for label, _ in bars], [v for _, v in bars], color="tab:blue")
    if dense is not None:
        ax.axhline(dense, color="grey", linestyle="--", label="dense baseline")
        ax.legend(fontsize=8)
    if bars:
        values = [v for _, v in bars] + ([dense] if dense is not None else [])
        ax.set_ylim(min(values) - 0.05, max(values) + 0.05)
    ax.set(ylabel="validation loss", title="sequential ablation, scaled-down small cell")
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
