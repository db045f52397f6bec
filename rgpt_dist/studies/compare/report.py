"""The report of the CPU-scale Table 1 comparison (issue #14; its runs: rgpt_dist.studies.compare):
the grid table, the early-exit curves in one plot, and the spread of two seeds. `report` writes
OUT/compare.md (+ .json), OUT/grid.{md,csv,json} (rgpt_dist.eval.grid) and OUT/early_exit.png from the
runs' own records. No torch import.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from rgpt_dist import strict_json
from rgpt_dist.eval.grid import paper_val_loss, summarize, write_table
from rgpt_dist.markdown import cell, code
from rgpt_dist.studies.base import Run
from matplotlib.figure import Figure

SPREAD_FAMILY = "recurrent_gpt"
"""The model trained at every seed in `compare`: the run-to-run spread beside the differences."""


def report(out_dir: str | Path, runs: list[Run]) -> dict[str, Path]:
    """compare.md and compare.json (one row per run, the seed spread), grid.{md,csv,json} and
    early_exit.png in out_dir, from the runs' own records."""
    out_dir = Path(out_dir)
    rows = {r["name"]: r for r in summarize(out_dir, stale_after_s=None)}
    table = [rows[run.name] for run in runs if run.name in rows]
    paths = dict(zip(("grid_md", "grid_csv", "grid_json"), write_table(table, out_dir)))
    spread = seed_spread(table)
    models = model_summary(table)
    (out_dir / "compare.json").write_text(strict_json.dumps({"runs": table, "seed_spread": spread, "models": models},
                                                            indent=1) + "\n")
    every_seeded = all(m["seeds"] > 1 for m in models)
    (out_dir / "compare.md").write_text(markdown(table, spread, every_seeded) + ordering_markdown(models))
    plot_early_exit(table, out_dir / "early_exit.png")
    return {**paths, "md": out_dir / "compare.md", "json": out_dir / "compare.json", "png": out_dir / "early_exit.png"}


def seed_spread(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Validation losses of the spread model's seeds: each, their mean and max - min."""
    losses = {r["name"]: r["val_loss"] for r in rows if r["family"] == SPREAD_FAMILY and r["val_loss"] is not None}
    if len(losses) < 2:
        return None
    values = list(losses.values())
    return {"runs": losses, "mean": statistics.fmean(values), "range": max(values) - min(values)}


def model_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model (its cell, i.e. the run name without the seed): the finished seeds' validation losses,
    their mean, sample SD (None for one seed) and max - min, our rank by the mean, and the paper's
    Table 1 validation loss of the cell (rgpt_dist.eval.grid.paper_val_loss) with its rank among the
    models that have one; sorted by our mean."""

    by_model: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_model.setdefault(_split_name(r["name"])[0], []).append(r)
    paper = paper_val_loss()
    out = []
    for model, runs in by_model.items():
        losses = [r["val_loss"] for r in runs if r["val_loss"] is not None]
        out.append({"model": model, "method": runs[0]["method"], "seeds": len(losses), "val_losses": losses,
                    "mean": statistics.fmean(losses) if losses else None,
                    "sd": statistics.stdev(losses) if len(losses) > 1 else None,
                    "range": max(losses) - min(losses) if losses else None, "paper_val_loss": paper.get(model)})
    out.sort(key=lambda m: (m["mean"] is None, m["mean"] or 0.0))
    ranked = sorted((m for m in out if m["paper_val_loss"] is not None), key=lambda m: m["paper_val_loss"])
    for i, m in enumerate(out):
        m["rank"] = i + 1 if m["mean"] is not None else None
        m["paper_rank"] = ranked.index(m) + 1 if m in ranked else None
    return out


def ordering_markdown(models: list[dict[str, Any]]) -> str:
    """Our ordering by the mean over seeds, with the spread, beside the paper's small-cell ordering."""
    if not any(m["seeds"] > 1 for m in models):
        return ""
    lines = ["", "## Ordering: mean validation loss over seeds, beside the paper's small cell", "",
             "| rank | method | model | seeds | mean | SD | max - min | paper val loss (20k) | paper rank |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        fmt = lambda x, spec=".4f": "-" if x is None else format(x, spec)  # noqa: E731
        lines.append(f"| {m['rank'] or '-'} | {cell(m['method'])} | {code(m['model'])} | {m['seeds']} | "
                     f"{fmt(m['mean'])} | {fmt(m['sd'])} | {fmt(m['range'])} | {fmt(m['paper_val_loss'], '.2f')} | "
                     f"{m['paper_rank'] or '-'} |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict[str, Any]], spread: dict[str, Any] | None, every_seeded: bool = False) -> str:
    """The per-run table and the spread model's seeds; `every_seeded`: every model has its own spread
    (the ordering's), so this one model's is not the noise level of the others."""
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
                 f"{spread['range']:.4f}. " + ("Every model's own spread is in the ordering below: read "
                 "each difference against those.\n" if every_seeded else "Differences between methods "
                 "smaller than this are within run-to-run noise.\n"))
    return text


def _split_name(run_name: str) -> tuple[str, str]:
    """(model, seed) of a run's name, `<flavour>-seed<seed>` (rgpt_dist.studies.compare.Run.name)."""
    model, _, seed = run_name.rpartition("-seed")
    return (model, seed) if model else (run_name, "")


def plot_early_exit(rows: list[dict[str, Any]], path: Path) -> None:
    """Validation loss at every exit depth of each depth-recurrent run, the dense runs as lines: the
    whole range on the left, zoomed on the right onto the losses from r = 1 on (a noise-state start,
    Poisson's r = 0, is 4x the rest). One colour per method, one line style per seed."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    seeds = list(dict.fromkeys(_split_name(r["name"])[1] for r in rows))
    fig = Figure(figsize=(12, 4.8))  # no pyplot: no global figure state
    axes = fig.subplots(1, 2)
    late = [x for r in rows for x in (r["early_exit"] or [])[1:]]
    late += [r["val_loss"] for r in rows if r["setting"] == "dense"]
    late = [x for x in late if x is not None and math.isfinite(x)]  # a diverged exit has no place on the axis
    for ax in axes:
        for r in rows:
            style = dict(color=f"C{methods.index(r['method'])}", label=f"{r['method']} ({r['name']})",
                         linestyle=("-", "--", ":", "-.")[seeds.index(_split_name(r["name"])[1]) % 4])
            if r["early_exit"]:
                ax.plot(range(len(r["early_exit"])), r["early_exit"], marker="o", markersize=3, **style)
            elif r["setting"] == "dense" and r["val_loss"] is not None:
                ax.axhline(r["val_loss"], linewidth=1, **style)
        ax.set(xlabel="exit depth r (0 = prelude into coda)", ylabel="validation loss")
    axes[0].set_title("early exit, scaled-down small isoFLOPs cell")
    if late:
        pad = 0.05 * (max(late) - min(late) or 1.0)
        axes[1].set(ylim=(min(late) - pad, max(late) + pad), title="zoomed: r >= 1 and the dense runs")
    axes[1].legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
