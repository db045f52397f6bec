"""The computational frontier of a trained thinking model: test accuracy over (difficulty x thinking
steps), and its aggregation over seeds (SPEC section 8; the authors' evaluation matrix).

    result = frontier_run("runs/thinking/graph-s42")      # the task's grid of difficulties and steps
    write_frontier(result, out)                          # frontier.json, frontier.md, frontier.png
    write_table(load_frontiers(["runs/thinking"]), out)  # mean and sample SD over seeds, heatmap of the mean

1. The checkpoint: the last one (train.max_steps; the authors evaluate their final model), or with
   checkpoint="best" the minimum validation loss (rgpt_dist.algorithmic.evaluate's selection).
2. Every difficulty: the test bucket of n examples (tasks/base.py `bucket`: label-balanced, so a
   constant predictor scores exactly 0.5), batches of `batch_size`, fp32, eval mode. One forward of
   max(steps) steps reads every step count (the readout after step s of a longer run is an s-step
   run's: model.py), so the grid costs one pass per bucket. A fixed-depth baseline has one column.
3. Accuracy = (logit > 0) == label, per cell.

Bad input is refused (FrontierError) before the model loads: a run not trained on a thinking task,
difficulties outside the generator's range, steps outside 1..model.max_steps, an odd bucket size.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

from rgpt_dist.algorithmic.evaluate import load_model, model_label, run_config, select_checkpoint, select_last
from rgpt_dist.algorithmic.table import LABEL, fmt, mean_sd
from rgpt_dist.markdown import cell
from rgpt_dist.progress import bar
from rgpt_dist.run_files import RunFileError, read_mapping
from rgpt_dist.strict_json import dumps
from rgpt_dist.thinking.inputs import collate
from rgpt_dist.thinking.ood import AUTHORS_OOD, authors_ood_best, ood_cell_mean
from rgpt_dist.thinking.tasks import TASKS, ThinkingTaskError, bucket

EVAL_BATCH = 100


class FrontierError(ValueError):
    """Bad input to the frontier evaluation or its table, naming the value or the file."""


def _grid(task, model: dict, difficulties, steps) -> tuple[list[int], list[int]]:
    difficulties = list(task.eval_difficulties if difficulties is None else difficulties)
    if not difficulties:
        raise FrontierError("no difficulty to evaluate")
    try:
        for d in difficulties:
            task.check_difficulty(d)
    except ThinkingTaskError as e:
        raise FrontierError(str(e)) from None
    if model.get("fixed_layers"):
        return difficulties, [int(model["fixed_layers"])]
    top = int(model.get("max_steps", 0))
    steps = [s for s in task.eval_steps if s <= top] if steps is None else list(steps)
    bad = [s for s in steps if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= top]
    if bad or not steps:
        raise FrontierError(f"thinking steps {bad or steps} must be integers in 1..model.max_steps={top} "
                            f"(the depth embedding's rows)")
    return difficulties, sorted(set(steps))


def frontier_run(run_dir: str | Path, difficulties=None, steps=None, n: int | None = None,
                 batch_size: int = EVAL_BATCH, device: str = "cpu", trust: bool = False,
                 checkpoint: str = "last") -> dict[str, Any]:
    """The frontier.json record of one run (module docstring)."""
    config = run_config(run_dir)
    name, model_cfg = (config.get("data") or {}).get("task"), config.get("model") or {}
    if name not in TASKS or model_cfg.get("family") != "thinking":
        raise FrontierError(f"{run_dir} did not train a thinking model on a thinking task "
                            f"(data.task={name!r}, model.family={model_cfg.get('family')!r})")
    task = TASKS[name]
    n = task.bucket_size if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 2 or n % 2:
        raise FrontierError(f"bucket size n={n!r} must be a positive even integer (label balance)")
    difficulties, step_grid = _grid(task, model_cfg, difficulties, steps)
    selection = (select_last if checkpoint == "last" else select_checkpoint)(run_dir, config)
    model, step = load_model(selection.tag_dir, device, trust, config)
    correct = np.zeros((len(difficulties), len(step_grid)), dtype=np.int64)
    with torch.no_grad():
        for i, d in enumerate(bar(difficulties, desc=f"{name} frontier rows", unit="difficulty")):
            examples = bucket(task, "test", d, n)
            for start in range(0, n, batch_size):
                x = collate(task, examples[start:start + batch_size], task.max_len).to(device)
                every = model.logits(x, max(step_grid), all_steps=True)     # [S, B] (fixed depth: [1, B])
                rows = every if model_cfg.get("fixed_layers") else every[[s - 1 for s in step_grid]]
                correct[i] += ((rows > 0).long() == x.labels).sum(-1).cpu().numpy()
    return {"task": name, "model": model_label(Path(run_dir), config)[0], "seed": (config.get("train") or {}).get("seed"),
            "step": step, "checkpoint": selection.tag_dir.name, "checkpoint_choice": checkpoint,
            "difficulties": difficulties, "steps": step_grid, "n": n, "fixed_layers": model_cfg.get("fixed_layers", 0),
            "train_range": list(task.train_range), "train_steps": [model_cfg.get("train_steps_min"), model_cfg.get("train_steps_max")],
            "supervision_alpha": model_cfg.get("supervision_alpha", 0.0),
            "accuracy": (correct / n).tolist(), "run_dir": str(Path(run_dir).resolve())}


def _markdown(title: str, difficulties, steps, cells: list[list[str]], train_range, note: str = "") -> list[str]:
    lo, hi = train_range
    out = [f"### {title}", "", "| difficulty \\ steps | " + " | ".join(str(s) for s in steps) + " |",
           "|---" * (len(steps) + 1) + "|"]
    for d, row in zip(difficulties, cells):
        tag = "" if lo <= d <= hi else " (OOD)"
        out.append(f"| {d}{tag} | " + " | ".join(row) + " |")
    return out + ([""] + [note] if note else []) + [""]


def heatmap(values: np.ndarray, difficulties, steps, title: str, path: Path) -> Path:
    """The authors' picture: accuracy per (difficulty, steps), 0.4 (red) to 1.0 (green), annotated."""
    fig = Figure(figsize=(1.0 + 0.75 * len(steps), 1.2 + 0.5 * len(difficulties)))  # no pyplot: no global state
    ax = fig.subplots()
    im = ax.imshow(values, cmap="RdYlGn", vmin=0.4, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(steps)), [str(s) for s in steps])
    ax.set_yticks(range(len(difficulties)), [str(d) for d in difficulties])
    ax.set_xlabel("thinking steps")
    ax.set_ylabel("difficulty")
    for i in range(len(difficulties)):
        for j in range(len(steps)):
            ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if values[i, j] < 0.6 else "black")
    fig.colorbar(im, ax=ax, shrink=0.8, label="accuracy")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def write_frontier(result: dict, out: Path) -> dict[str, Path]:
    """frontier.json, frontier.md and frontier.png of one run in `out` (an existing directory)."""
    out = Path(out)
    acc = np.asarray(result["accuracy"])
    title = f"{result['task']} {result['model']} seed {result['seed']} ({result['checkpoint']}, n={result['n']})"
    (out / "frontier.json").write_text(dumps(result, indent=1) + "\n")
    cells = [[f"{v:.3f}" for v in row] for row in acc]
    (out / "frontier.md").write_text("\n".join(_markdown(title, result["difficulties"], result["steps"], cells,
                                                         result["train_range"])))
    return {"json": out / "frontier.json", "md": out / "frontier.md",
            "plot": heatmap(acc, result["difficulties"], result["steps"], title, out / "frontier.png")}


def load_frontiers(sources) -> list[dict]:
    """Every frontier.json named or found under the sources (directories searched recursively)."""
    files: list[Path] = []
    for source in map(Path, sources):
        if source.is_dir():
            files += sorted(source.rglob("frontier.json"))
        elif source.is_file():
            files.append(source)
        else:
            raise FrontierError(f"{source} does not exist")
    if not files:
        raise FrontierError(f"no frontier.json under {', '.join(map(str, sources))}")
    out = []
    for f in files:
        try:
            out.append(read_frontier(f))
        except RunFileError as e:
            raise FrontierError(f"not a frontier record: {e}") from None
    return out


def _ints(lo: int, hi: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def read_frontier(path: Path) -> dict:
    """One frontier.json, the fields the table uses checked (the task a known one, the model label one
    line without a pipe, the grid's difficulties and steps bounded integers, every accuracy a fraction
    in [0, 1] in a difficulties x steps grid) and only those kept, with its `file`."""
    f = read_mapping(path)
    diffs = f.list("difficulties", _ints(0, 10_000), "integers in 0..10,000", max_len=1000)
    steps = f.list("steps", _ints(0, 10_000), "integers in 0..10,000", max_len=1000)
    fraction = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1  # noqa: E731 (NaN fails)
    accuracy = f.list("accuracy", lambda row: isinstance(row, list) and len(row) == len(steps) and all(map(fraction, row)),
                      f"{len(diffs)} rows of {len(steps)} fractions in [0, 1]", max_len=len(diffs))
    if len(accuracy) != len(diffs):
        raise f.fail("accuracy", f"has {len(accuracy)} rows for {len(diffs)} difficulties")
    return {"task": f.str("task", choices=tuple(TASKS)), "model": f.str("model", pattern=LABEL),
            "seed": f.int("seed", lo=0, hi=2**32 - 1), "step": f.int("step", optional=True, lo=0),
            "checkpoint_choice": f.str("checkpoint_choice", optional=True, choices=("best", "last")) or "last",
            "difficulties": diffs, "steps": steps, "accuracy": accuracy, "n": f.int("n", lo=1, hi=10**7),
            "train_range": f.list("train_range", _ints(0, 10_000), "two integers", max_len=2),
            "supervision_alpha": f.number("supervision_alpha", optional=True, lo=0.0, hi=1.0) or 0.0,
            "file": str(path)}


def aggregate(results: list[dict]) -> list[dict]:
    """Groups by (task, model, checkpoint choice, grid): per cell the mean and sample SD over seeds."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        key = (r["task"], r["model"], r.get("checkpoint_choice", "last"), tuple(r["difficulties"]), tuple(r["steps"]))
        groups.setdefault(key, []).append(r)
    out = []
    for (task, model, choice, diffs, steps), members in sorted(groups.items(), key=lambda kv: kv[0][:3]):
        seeds = [m["seed"] for m in members]
        if len(set(seeds)) != len(seeds):
            raise FrontierError(f"{task} {model}: seed {seeds} appears twice ({', '.join(m['file'] for m in members)})")
        stack = np.asarray([m["accuracy"] for m in members], dtype=float)     # [seeds, difficulties, steps]
        stats = [[mean_sd(stack[:, i, j]) for j in range(len(steps))] for i in range(len(diffs))]
        hi = members[0]["train_range"][1]
        cells = sum(1 for d in diffs for s in steps if d > hi and s >= d)
        ours = _over_seeds([ood_cell_mean(a, diffs, steps, hi) for a in stack])
        theirs = _over_seeds([authors_ood_best(a, diffs, steps, task) for a in stack])
        out.append({"task": task, "model": model, "checkpoint": choice, "seeds": sorted(seeds),
                    "difficulties": list(diffs), "steps": list(steps), "train_range": members[0]["train_range"],
                    "n": members[0]["n"], "supervision_alpha": members[0].get("supervision_alpha", 0.0),
                    "mean": [[m for m, _ in row] for row in stats], "sd": [[s for _, s in row] for row in stats],
                    "ood_cell_mean": {**ours, "cells": cells},
                    "authors_ood_best": {**theirs, "hops": list(AUTHORS_OOD.get(task, ()))}})
    return out


def _over_seeds(per_seed: list[float | None]) -> dict:
    """{"mean", "sd"} over seeds of a per-seed statistic (sample SD; None where undefined)."""
    if not per_seed or any(v is None for v in per_seed):
        return {"mean": None, "sd": None}
    mean, sd = mean_sd(per_seed)
    return {"mean": mean, "sd": sd}


def _percent(stat: dict) -> str:
    if stat["mean"] is None:
        return "n/a"
    return fmt(100 * stat["mean"], None if stat["sd"] is None else 100 * stat["sd"])


def _supervision(groups: list[dict]) -> list[str]:
    """Per task with runs at several supervision weights a, two out-of-distribution statistics
    (rgpt_dist.thinking.ood): ours, the mean over every cell beyond the training range with steps >=
    difficulty, and the authors', the mean over hops 6, 8, 10, 12 of the best accuracy at steps >= hops."""
    lines = []
    for task in sorted({g["task"] for g in groups}):
        mine = sorted((g for g in groups if g["task"] == task and g["ood_cell_mean"]["cells"]),
                      key=lambda g: g["supervision_alpha"])
        if len({g["supervision_alpha"] for g in mine}) < 2:
            continue
        hops = ", ".join(map(str, AUTHORS_OOD.get(task, ()))) or "none for this task"
        lines += [f"### {task}: per-step supervision a against out-of-distribution accuracy", "",
                  "| a | model | seeds | ours: mean over OOD cells, steps >= difficulty | "
                  f"authors': mean over hops ({hops}) of the best at steps >= hops |", "|---|---|---|---|---|"]
        for g in mine:
            lines.append(f"| {g['supervision_alpha']:g} | {cell(g['model'])} | {len(g['seeds'])} | "
                         f"{_percent(g['ood_cell_mean'])} | {_percent(g['authors_ood_best'])} |")
        lines += ["", "Percent, mean ± sample SD over seeds (rgpt_dist.thinking.ood).", ""]
    return lines


def write_table(results: list[dict], out: Path) -> dict[str, Path]:
    """table.md, table.json and one heatmap of the seed mean per group (frontier_<task>_<model>.png)."""
    out = Path(out)
    groups = aggregate(results)
    lines, paths = ["# The computational frontier: accuracy, mean ± sample SD over seeds", ""], {}
    for g in groups:
        title = f"{g['task']} {g['model']} ({g['checkpoint']} checkpoint; seeds {', '.join(map(str, g['seeds']))}; n={g['n']})"
        cells = [[fmt(100 * m, None if s is None else 100 * s) for m, s in zip(ms, ss)]
                 for ms, ss in zip(g["mean"], g["sd"])]
        lines += _markdown(title, g["difficulties"], g["steps"], cells, g["train_range"], "Percent.")
        name = f"frontier_{g['task']}_{g['model']}_{g['checkpoint']}".replace(" ", "_").replace("/", "_")
        paths[name] = heatmap(np.asarray(g["mean"]), g["difficulties"], g["steps"], title + ": mean",
                              out / f"{name}.png")
    (out / "table.md").write_text("\n".join(lines + _supervision(groups)))
    (out / "table.json").write_text(dumps({"groups": groups, "sd": "sample SD, ddof = 1; null for one seed"},
                                          indent=1) + "\n")
    return {"md": out / "table.md", "json": out / "table.json", **paths}
