"""The report of `make compare-rt` (issue #27; its runs: rgpt_dist.studies.rt_compare): per model the
final validation loss of each seed, their mean and max - min, the RT's difference from the dense model
against that spread, and the training curves. Writes OUT/rt_compare.md (+ .json) and OUT/rt_compare.png
from the runs' own records (rgpt_dist.eval.grid's reader). No torch import.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from rgpt_dist import strict_json
from rgpt_dist.eval.grid import summarize
from rgpt_dist.markdown import cell, code
from rgpt_dist.studies.base import Run
from rgpt_dist.train.metrics import read_metrics


def summary(rows: dict[str, dict[str, Any]], runs: list[Run]) -> dict[str, Any]:
    """Per model (the plan's order: dense, then RT): {run name: final val loss}, mean, range; and the
    RT's mean minus the dense mean."""
    models: dict[str, Any] = {}
    for model in _models(runs):
        losses = {run.name: rows[run.name]["val_loss"] for run in runs
                  if run.model == model and run.name in rows and rows[run.name]["val_loss"] is not None}
        values = list(losses.values())
        models[model] = {"runs": losses, "mean": statistics.fmean(values) if values else None,
                         "range": max(values) - min(values) if len(values) > 1 else None,
                         "params_no_embedding": next((rows[n]["params_no_embedding"] for n in losses), None),
                         "params": next((rows[n]["params"] for n in losses), None)}
    dense, rt = (models[m]["mean"] for m in _models(runs))
    return {"models": models, "rt_minus_dense": None if dense is None or rt is None else rt - dense}


def _models(runs: list[Run]) -> list[str]:
    return list(dict.fromkeys(run.model for run in runs))


def markdown(result: dict[str, Any]) -> str:
    lines = ["| model | params (non-emb.) | params | val loss per seed | mean | max - min |", "|---|---|---|---|---|---|"]
    for model, m in result["models"].items():
        seeds = ", ".join(f"{code(n)} {v:.4f}" for n, v in m["runs"].items())
        fmt = (lambda x, f: "-" if x is None else format(x, f))
        lines.append(f"| {cell(model)} | {fmt(m['params_no_embedding'], ',')} | {fmt(m['params'], ',')} | {seeds} | "
                     f"{fmt(m['mean'], '.4f')} | {fmt(m['range'], '.4f')} |")
    diff = result["rt_minus_dense"]
    if diff is not None:
        lines += ["", f"RT minus dense (means): {diff:+.4f}; compare it with the seeds' max - min above."]
    return "\n".join(lines) + "\n"


def plot(runs: list[Run], out_dir: Path, path: Path) -> None:
    """Training loss against step for every run (colour: model), the final validation losses as points."""
    fig = Figure(figsize=(7, 4.5))  # no pyplot: no global figure state
    ax = fig.subplots()
    colours = dict(zip(_models(runs), ("tab:grey", "tab:blue")))
    for run in runs:
        records = [r for _, r in read_metrics(out_dir / run.name / "metrics.jsonl")]
        train = [(r["step"], r["loss"]) for r in records if "loss" in r]
        evals = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
        if train:
            ax.plot(*zip(*train), color=colours[run.model], alpha=0.8, label=f"{run.model} seed {run.seed}",
                    linestyle="-" if run.seed == runs[0].seed else "--")
        if evals:
            ax.plot(*zip(*evals), "o", color=colours[run.model])
    ax.set(xlabel="step (16 x 128 tokens)", ylabel="training loss (points: validation)",
           title="dense 4 x 64 against RT 2 x 90, same tokens")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(out_dir: str | Path, runs: list[Run]) -> dict[str, Path]:
    out_dir = Path(out_dir)
    rows = {r["name"]: r for r in summarize(out_dir, stale_after_s=None)}
    result = summary(rows, runs)
    paths = {"md": out_dir / "rt_compare.md", "json": out_dir / "rt_compare.json", "png": out_dir / "rt_compare.png"}
    paths["md"].write_text(markdown(result))
    paths["json"].write_text(strict_json.dumps({**result, "rows": [rows.get(r.name) for r in runs]}, indent=1) + "\n")
    plot(runs, out_dir, paths["png"])
    return paths
