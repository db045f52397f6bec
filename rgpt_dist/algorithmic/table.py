"""Three-seed aggregation of eval.json files into the RLT paper's layouts (J.4, Table 3, Figure 12).

    paths = write_tables(load_evals(["runs/algorithmic"]), out)   # table.md, table.json, accuracy_vs_length.png

Runs are grouped by (task, model, checkpoint choice: `best` or `last`, eval.json's
`checkpoint_choice`; files written before it existed are `best`). At each length, the score of
every seed is computed first, then
the mean and the sample standard deviation (ddof = 1, the paper's 1/2 for three seeds, Eq. J.1);
a group with one seed has no SD: it is reported as n/a (null in JSON), never 0. Scores are percent.

Layouts (table.md; the same numbers in table.json):
- Table 3: accuracy at the longest tested length, one row per task, one column per model;
- the in-distribution validation accuracy of the selected checkpoints (pooled validation lengths);
- per task, the full test grid: models x lengths, in the task's reported metric (addition: teacher-
  forced answer-token accuracy; the others final-label / final-state accuracy), and for the S5 tasks
  also prefix-token and whole-sequence accuracy (Figure 13's three scoring rules).
Last-checkpoint groups appear there as "MODEL (last)". The paper's own layouts (Tables 2 + 3, 7, 9)
are rgpt_dist.algorithmic.paper_tables: `layouts=("auto",)` adds every one that has data after the
layouts above, `("full",)` only those, and naming paper layouts writes just them.
The plot: one panel per task, mean with SD error bars clipped to 0-100 %, training lengths shaded,
the uniform-prediction accuracy dotted (Figure 12); the best-checkpoint groups only where a task has
any. No torch import.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from rgpt_dist.algorithmic import TASKS, get_task, paper_tables
from rgpt_dist.algorithmic.cells import TASK_TITLES, TableError, fmt, md_table, mean_sd, stat_cell  # noqa: F401 (fmt: re-exported)
from rgpt_dist.algorithmic.metrics import CHANCE, METRIC_NAMES, METRICS, PRIMARY
from rgpt_dist.run_files import Fields, RunFileError, read_mapping
from rgpt_dist.strict_json import dumps
from matplotlib.figure import Figure

TASK_ORDER = ("addition", "parity", "mod5_flat", "mod5_brackets", "s5_standard", "s5_swaps")
CHOICES = ("best", "last")
"""eval.json's checkpoint_choice (rgpt-algo eval --checkpoint); absent means best."""


def _files(sources) -> list[Path]:
    out = []
    for source in map(Path, sources):
        if source.is_dir():
            found = sorted(source.rglob("eval.json"))
            if not found:
                raise TableError(f"{source}: no eval.json under this directory")
            out += found
        elif source.is_file():
            out.append(source)
        else:
            raise TableError(f"{source}: no such file or directory")
    return list(dict.fromkeys(p.resolve() for p in out))


def load_evals(sources) -> list[dict]:
    """Every eval.json named or found (recursively) under the sources, each with its `file`."""
    evals = []
    for path in _files(sources):
        try:
            evals.append(read_eval(path))
        except RunFileError as e:
            raise TableError(f"not an rgpt-algo eval.json: {e}") from None
    if not evals:
        raise TableError("no eval.json given")
    return evals


LABEL = re.compile(r"[^\x00-\x1f\x7f|`]{1,200}")
"""A model label as eval.json records it (a flavour and the model overrides): one line, no pipe."""
LENGTH = re.compile(r"[1-9][0-9]{0,5}")


def _scores(f: Fields) -> dict:
    """A per-length or pooled score record: each metric present a fraction in [0, 1]."""
    return {m: f.number(m, optional=True, lo=0.0, hi=1.0) for m in METRICS if m in f.data}


def read_eval(path: Path) -> dict:
    """One eval.json, the fields the tables use checked (types, ranges: accuracies in [0, 1], lengths
    positive integers, the task a known one, the model label one line without a pipe) and only those
    kept, with its `file`. Everything else a record holds never reaches a table."""
    f = read_mapping(path)
    task, model, seed = f.str("task", choices=tuple(TASKS)), f.str("model", pattern=LABEL), f.int("seed", lo=0, hi=2**32 - 1)
    test, validation = f.mapping("test"), f.mapping("validation")
    for n in test.data:
        if not LENGTH.fullmatch(n):
            raise test.fail(n, "is not a test length (a positive integer)")
    train_lengths = f.list("train_lengths", lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 < v < 10**6,
                           "two positive integers", optional=True, max_len=2)
    return {"task": task, "model": model, "seed": seed,
            "step": f.int("step", optional=True, lo=0), "primary_metric": f.str("primary_metric", choices=METRICS),
            "checkpoint_choice": f.str("checkpoint_choice", optional=True, choices=CHOICES) or "best",
            "limit": f.int("limit", optional=True, lo=1),
            "test": {n: _scores(test.mapping(n)) for n in test.data},
            "validation": {"accuracy": validation.number("accuracy", optional=True, lo=0.0, hi=1.0)},
            "train_lengths": train_lengths, "file": str(path)}


def _pct(value) -> float | None:
    return None if value is None else 100.0 * float(value)


def _stat(values: list[float]) -> dict:
    mean, sd = mean_sd(values)
    return {"n": len(values), "values": values, "mean": mean, "sd": sd}


def aggregate(evals: list[dict]) -> list[dict]:
    """One entry per (task, model, checkpoint choice): seeds, files, and per metric and test length
    {n, values, mean, sd} in percent (seeds without a score at a length are left out of it), plus the
    validation accuracy. A seed given twice in a group is refused."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for e in evals:
        groups.setdefault((e["task"], e["model"], e.get("checkpoint_choice", "best")), []).append(e)
    out = []
    for (task, model, choice), members in sorted(groups.items(), key=lambda kv: (_task_rank(kv[0][0]), kv[0][1:])):
        seeds = [m["seed"] for m in members]
        twice = sorted({s for s in seeds if seeds.count(s) > 1}, key=str)
        if twice:
            files = [m["file"] for m in members if m["seed"] in twice]
            raise TableError(f"task {task}, model {model}, {choice} checkpoint: seed {twice[0]} appears twice "
                             f"({', '.join(files)})")
        members.sort(key=lambda m: (str(type(m["seed"])), m["seed"]))
        lengths = sorted({int(n) for m in members for n in m["test"]})
        metrics = {}
        for metric in METRICS:
            metrics[metric] = {}
            for n in lengths:
                values = [_pct(m["test"][str(n)].get(metric)) for m in members if str(n) in m["test"]]
                values = [v for v in values if v is not None]
                if values:
                    metrics[metric][n] = _stat(values)
        val = [_pct(m["validation"].get("accuracy")) for m in members]
        out.append({"task": task, "model": model, "checkpoint": choice,
                    "primary_metric": PRIMARY.get(task, members[0]["primary_metric"]),
                    "seeds": [m["seed"] for m in members], "steps": [m.get("step") for m in members],
                    "files": [m["file"] for m in members], "limits": sorted({str(m.get("limit")) for m in members}),
                    "lengths": lengths, "metrics": metrics,
                    # the training lengths [shortest, longest] the runs recorded (older eval.json: none)
                    "train_lengths": next((m["train_lengths"] for m in members if m.get("train_lengths")), None),
                    "validation": _stat([v for v in val if v is not None]) if any(v is not None for v in val) else None})
    return out


def _task_rank(task: str) -> tuple[int, str]:
    return (TASK_ORDER.index(task) if task in TASK_ORDER else len(TASK_ORDER), task)


def _label(group: dict) -> str:
    """The model's column name: the flavour, "(last)" added for the last-checkpoint groups."""
    return group["model"] + (" (last)" if group.get("checkpoint") == "last" else "")


def markdown(groups: list[dict], layouts=("auto",), models=None) -> str:
    """table.md: the layouts of the module doc (`models`: paper_tables.build's column override)."""

    paper = _paper_layouts(groups, layouts, models)
    lines = ["# Length generalisation (accuracy %, mean ± sample SD over seeds, ddof = 1)", ""]
    limits = sorted({lim for g in groups for lim in g["limits"] if lim != "None"})
    if limits:
        lines += [f"**Not the paper's protocol**: only the first {', '.join(limits)} examples per length were scored.", ""]
    lines += ["Cells without (n=k) average three seeds; one seed has no SD (n/a).", ""]
    if "full" in layouts or "auto" in layouts:
        lines += _full(groups)
    for layout in paper:
        lines += [""] + paper_tables.render(paper_tables.build(layout, groups, models))
    return "\n".join(lines) + "\n"


def check_layouts(layouts, models=None) -> list[str]:
    """The paper layouts named; TableError for an unknown name, or `models` given without exactly
    one paper layout or with another count than its models (checked before any file is read)."""

    unknown = [x for x in layouts if x not in ("auto", "full", *paper_tables.LAYOUTS)]
    if unknown or not layouts:
        raise TableError(f"unknown layout {(unknown or [''])[0]!r}: expected auto, full or "
                         f"{', '.join(paper_tables.LAYOUTS)}")
    named = [x for x in paper_tables.LAYOUTS if x in layouts]
    if models is not None:
        if len(named) != 1 or len(layouts) != 1:
            raise TableError(f"--models replaces one paper layout's models: name exactly one of "
                             f"{', '.join(paper_tables.LAYOUTS)} with --layout (got {','.join(layouts)})")
        paper_tables.columns(named[0], models)
    return named


def _paper_layouts(groups: list[dict], layouts, models=None) -> list[str]:
    """The paper layouts to write: those named, plus (auto) every one with data."""

    named = check_layouts(layouts, models)
    return named + [x for x in paper_tables.present(groups) if "auto" in layouts and x not in named]


def _full(groups: list[dict]) -> list[str]:
    """Table 3 over every model, the validation accuracy and the per-task grids (module doc)."""
    models = sorted({_label(g) for g in groups})
    tasks = sorted({g["task"] for g in groups}, key=_task_rank)
    by = {(g["task"], _label(g)): g for g in groups}
    lines = ["## Accuracy at the longest tested length (Table 3 layout)", ""]
    rows = []
    for task in tasks:
        longest = max(n for m in models if (task, m) in by for n in by[task, m]["lengths"])
        metric = PRIMARY.get(task, "final")
        rows.append([f"{TASK_TITLES.get(task, task)} ({longest})"]
                    + [stat_cell(by[task, m]["metrics"][metric].get(longest)) if (task, m) in by else "-" for m in models])
    lines += md_table(["Task (test length)", *models], rows)
    lines += ["", "## In-distribution validation accuracy of the selected checkpoints", ""]
    lines += md_table(["Task", *models], [[TASK_TITLES.get(t, t)] + [stat_cell(by[t, m]["validation"]) if (t, m) in by
                                                                      else "-" for m in models] for t in tasks])
    for task in tasks:
        metrics = [PRIMARY.get(task, "final")] + (["token", "sequence"] if task.startswith("s5") else [])
        lengths = sorted({n for m in models if (task, m) in by for n in by[task, m]["lengths"]})
        for metric in metrics:
            lines += ["", f"## {TASK_TITLES.get(task, task)}: {METRIC_NAMES[metric]}", ""]
            lines += md_table(["Model", "seeds", *map(str, lengths)],
                               [[m, ", ".join(map(str, by[task, m]["seeds"]))]
                                + [stat_cell(by[task, m]["metrics"][metric].get(n)) for n in lengths]
                                for m in models if (task, m) in by])
    return lines


def plot(groups: list[dict], path: Path) -> Path:
    """accuracy_vs_length.png (module doc)."""

    tasks = sorted({g["task"] for g in groups}, key=_task_rank)
    cols = min(3, len(tasks))
    rows = math.ceil(len(tasks) / cols)
    fig = Figure(figsize=(4.6 * cols, 3.6 * rows))  # no pyplot: no global figure state
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        metric = PRIMARY.get(task, "final")
        lengths = set()
        mine = [g for g in groups if g["task"] == task]
        best = [g for g in mine if g["checkpoint"] == "best"]
        for g in best or mine:                  # the paper's figures: best checkpoints (last ones alone if only)
            stats = g["metrics"][metric]
            xs = sorted(stats)
            lengths.update(xs)
            mean = np.array([stats[n]["mean"] for n in xs])
            sd = np.array([0.0 if stats[n]["sd"] is None else stats[n]["sd"] for n in xs])
            err = np.vstack([np.minimum(sd, mean), np.minimum(sd, 100.0 - mean)])   # clipped to 0..100
            ax.errorbar(xs, mean, yerr=err, marker="o", capsize=3, label=f"{_label(g)} (n={len(g['seeds'])})")
        spans = [g["train_lengths"] for g in (best or mine) if g.get("train_lengths")]
        train = [n for span in spans for n in span] or [n for n in get_task(task).lengths("train") if n is not None]
        lo, hi = min(train), max(train)        # the runs' own training range (a capped grid), else the task's
        ax.axvspan(lo / 1.04, hi * 1.04, color="0.85", zorder=0, label="training lengths")
        if task in CHANCE:
            ax.axhline(100 * CHANCE[task], linestyle=":", color="0.3", label="chance")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(lengths))
        ax.set_xticklabels([str(n) for n in sorted(lengths)], fontsize=7)
        ax.set_xlim(min(lengths) / 1.15, max(lengths) * 1.15)   # the tested range; shading clipped to it
        ax.set_ylim(-2, 102)
        ax.set_title(TASK_TITLES.get(task, task))
        ax.set_xlabel("digits per operand" if task == "addition" else "length")
        ax.set_ylabel(("token" if metric == "token" else "final") + " accuracy (%)")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    chosen = "best ID-validation-loss checkpoints" if any(g["checkpoint"] == "best" for g in groups) \
        else "last checkpoints"
    fig.suptitle(f"Length generalisation: mean ± sample SD over seeds; {chosen}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def write_tables(evals: list[dict], out: Path, layouts=("auto",), models=None) -> dict[str, Path]:
    """table.md, table.json and accuracy_vs_length.png in `out` (an existing directory); `layouts`
    and `models` as markdown()."""

    groups = aggregate(evals)
    out = Path(out)
    md = markdown(groups, layouts, models)
    paper = {x: paper_tables.build(x, groups, models) for x in _paper_layouts(groups, layouts, models)}
    (out / "table.md").write_text(md)
    (out / "table.json").write_text(dumps({"groups": groups, "layouts": paper, "unit": "percent",
                                           "sd": "sample SD, ddof = 1; null for one seed"}, indent=1) + "\n")
    return {"md": out / "table.md", "json": out / "table.json",
            "plot": plot(groups, out / "accuracy_vs_length.png")}
