"""The RLT paper's own table layouts (Tables 2 + 3, 7 and 9) from aggregated eval.json groups.

    groups = aggregate(load_evals(["runs/algorithmic"]))        # rgpt_dist.algorithmic.table
    data = build("table9", groups)                               # {"layout", "title", "columns", "rows", "notes"}
    lines = render(data)                                         # markdown lines

A group is one (task, model, checkpoint choice) with per-length {n, values, mean, sd} in percent
(`table.aggregate`); a layout picks its cells from the groups by flavour name, and a cell with no
group (or no score at that length) is None ("-"). Mean ± sample SD (ddof = 1) over the seeds, as
everywhere (J.4); the paper's columns are the flavours below, and `models` replaces them in order
(e.g. the CPU-scale flavours of `make rlt`), the header then naming the flavour used.

- table2 (J.1.1's Table 2, then section 3's Table 3 in the same columns): the in-distribution
  validation accuracy of the fixed last checkpoint ("after 2,000 optimizer steps": `rgpt-algo eval
  --checkpoint last`; the steps are listed under the table, mod-5 runs 5,000 here as in section 3),
  one row per task in the paper's order, columns RLT-1 4+4 ... 8+0 and the Transformer 8; then the
  test accuracy at each task's longest tested length of the best checkpoints (Table 3).
- table7 (J.8): parity at its longest tested length (256 bits), one row per sixteen-layer model:
  the best checkpoint's step(s), its accuracy, and the last checkpoint's accuracy.
- table9 (J.9): 4 + 4 across feedback variants at the paper's selected lengths (parity 64, swaps-S5
  48, standard S5 32, flat mod-5 63, bracketed mod-5 64), final-answer / final-state accuracy of the
  best checkpoints, columns RLT-1, RLT-0, RLT-2 chunk4, Transformer 8.
`present(groups)`: the layouts with at least one cell (the CLI's --layout auto).
"""
from __future__ import annotations

from rgpt_dist.algorithmic.metrics import PRIMARY
from rgpt_dist.algorithmic.cells import TASK_TITLES, TableError, md_table, stat_cell

SPLITS8 = ("4+4", "5+3", "6+2", "7+1", "8+0")
TABLE2_TASKS = ("addition", "parity", "mod5_flat", "mod5_brackets", "s5_swaps", "s5_standard")
"""Table 2's row order (Table 3 lists standard S5 before swaps; one order is kept for both)."""
TABLE9_ROWS = (("parity", 64, "Parity / 64"), ("s5_swaps", 48, "S5 swaps / 48"),
               ("s5_standard", 32, "S5 standard / 32"), ("mod5_flat", 63, "Mod-5 flat / 63"),
               ("mod5_brackets", 64, "Mod-5 brackets / 64"))
COLUMNS = {
    "table2": tuple((f"rlt1-{s}", f"RLT-1 {s}") for s in SPLITS8) + (("rlt-transformer-8", "GPT 8"),),
    "table7": tuple((f"rlt1-{e}+{16 - e}", f"RLT-1 {e}+{16 - e}") for e in range(8, 17))
    + (("rlt-transformer-16", "Transformer 16"),),
    "table9": (("rlt1-4+4", "RLT-1"), ("rlt0-4+4", "RLT-0"), ("rlt2-4+4", "RLT-2 chunk4"),
               ("rlt-transformer-8", "Transformer 8")),
}
"""Each layout's models (flavour, the paper's title): table2 and table9 columns, table7 rows."""
LAYOUTS = tuple(COLUMNS)


def columns(layout: str, models=None) -> list[tuple[str, str]]:
    """(flavour, header) of a layout; `models` replaces the flavours in order (same count)."""
    if layout not in COLUMNS:
        raise TableError(f"unknown layout {layout!r}: expected one of auto, full, {', '.join(LAYOUTS)}")
    paper = COLUMNS[layout]
    if models is None:
        return list(paper)
    models = list(models)
    if len(models) != len(paper):
        raise TableError(f"layout {layout} has {len(paper)} models ({', '.join(f for f, _ in paper)}); "
                         f"--models gave {len(models)} ({', '.join(models)})")
    return [(m, title if m == f else f"{title} ({m})") for m, (f, title) in zip(models, paper)]


def _index(groups: list[dict]) -> dict[tuple[str, str, str], dict]:
    return {(g["task"], g["model"], g["checkpoint"]): g for g in groups}


def _score(group: dict | None, metric: str, length: int) -> dict | None:
    return None if group is None else group["metrics"][metric].get(length)


def _table2(groups: list[dict], cols) -> dict:
    by = _index(groups)
    tasks = [t for t in TABLE2_TASKS if any(g["task"] == t for g in groups)]
    val = [[TASK_TITLES[t]] + [(by.get((t, m, "last")) or {}).get("validation") for m, _ in cols] for t in tasks]
    steps = {t: sorted({s for m, _ in cols for s in (by.get((t, m, "last")) or {}).get("steps", [])}) for t in tasks}
    longest = []
    for t in tasks:
        best = [by.get((t, m, "best")) for m, _ in cols]
        n = max((max(g["lengths"]) for g in best if g and g["lengths"]), default=None)
        metric = PRIMARY.get(t, "final")
        longest.append([f"{TASK_TITLES[t]} ({n})"] + [None if n is None else _score(g, metric, n) for g in best])
    notes = ["Validation: the fixed last checkpoint (`rgpt-algo eval --checkpoint last`), pooled in-distribution "
             "validation lengths; its steps: " + "; ".join(f"{TASK_TITLES[t]} {', '.join(map(str, s)) or '-'}"
                                                          for t, s in steps.items()) + ".",
             "Test: the best-validation-loss checkpoints at each task's longest tested length (Table 3); "
             "addition teacher-forced answer-token accuracy, the others final label or state."]
    return {"title": "Table 2: validation accuracy at the last step; Table 3: accuracy at the longest length",
            "header": ["Task", *(h for _, h in cols)], "rows": val, "second_header": ["Task (test length)",
            *(h for _, h in cols)], "second_rows": longest, "notes": notes}


def _table7(groups: list[dict], cols) -> dict:
    by = _index(groups)
    best_g = [by.get(("parity", m, "best")) for m, _ in cols]
    last_g = [by.get(("parity", m, "last")) for m, _ in cols]
    n = max((max(g["lengths"]) for g in best_g + last_g if g and g["lengths"]), default=None)
    last_steps = sorted({s for g in last_g if g for s in g["steps"]})
    rows = [[title, ", ".join(map(str, b["steps"])) if b else "-", None if n is None else _score(b, "final", n),
             None if n is None else _score(last, "final", n)] for (_, title), b, last in zip(cols, best_g, last_g)]
    notes = [f"Parity at {n} bits, final-answer accuracy; best: the minimum ID validation loss, earliest tie "
             f"(its step per seed); last: the fixed last checkpoint (`rgpt-algo eval --checkpoint last`)."]
    return {"title": "Table 7: sixteen-layer parity, best versus last checkpoint",
            "header": ["Model", "Best step", "Best checkpoint", f"Step {', '.join(map(str, last_steps)) or 'last'}"],
            "rows": rows, "notes": notes}


def _table9(groups: list[dict], cols) -> dict:
    by = _index(groups)
    rows = [[label] + [_score(by.get((task, m, "best")), "final", n) for m, _ in cols] for task, n, label in TABLE9_ROWS
            if any(g["task"] == task for g in groups)]
    notes = ["Best-validation-loss checkpoints, final-answer / final-state accuracy at the selected lengths "
             "(standard S5 at 32 is in distribution, the other rows out of distribution)."]
    return {"title": "Table 9: 4+4 across feedback variants", "header": ["Task / length", *(h for _, h in cols)],
            "rows": rows, "notes": notes}


def build(layout: str, groups: list[dict], models=None) -> dict:
    """The layout's rows: label cells are strings, score cells {n, values, mean, sd} or None."""
    cols = columns(layout, models)
    data = {"table2": _table2, "table7": _table7, "table9": _table9}[layout](groups, cols)
    return {"layout": layout, "models": [m for m, _ in cols], **data}


def present(groups: list[dict]) -> list[str]:
    """The paper layouts that have at least one score cell among `groups`."""
    def filled(rows):
        return any(isinstance(c, dict) for row in rows for c in row)
    out = []
    for layout in LAYOUTS:
        data = build(layout, groups)
        if filled(data["rows"]) or filled(data.get("second_rows", [])):
            out.append(layout)
    return out


def _text(c) -> str:
    return c if isinstance(c, str) else stat_cell(c)


def render(data: dict) -> list[str]:
    """Markdown lines of one built layout."""
    lines = [f"## {data['title']}", ""]
    lines += md_table(data["header"], [[_text(c) for c in row] for row in data["rows"]])
    if "second_rows" in data:
        lines += [""] + md_table(data["second_header"], [[_text(c) for c in row] for row in data["second_rows"]])
    return lines + [""] + data["notes"]
