"""The cells of the algorithmic tables (rgpt_dist.algorithmic.table, paper_tables): task titles,
'mean ± SD' over seeds, markdown rows. Numpy only."""
from __future__ import annotations

import numpy as np

from rgpt_dist.markdown import cell

TASK_TITLES = {"addition": "Addition", "parity": "Parity", "mod5_flat": "Mod 5, no brackets",
               "mod5_brackets": "Mod 5, brackets", "s5_standard": "S5, standard", "s5_swaps": "S5, swaps"}


class TableError(ValueError):
    """Unusable eval.json input, naming the file."""


def mean_sd(values) -> tuple[float, float | None]:
    """(mean, sample SD with ddof = 1); SD None for a single value (undefined, not 0)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no values to aggregate")
    return float(values.mean()), (float(values.std(ddof=1)) if values.size > 1 else None)


def fmt(mean: float | None, sd: float | None) -> str:
    """'mean ± SD' with two decimals; SD n/a for one seed."""
    if mean is None:
        return "-"
    return f"{mean:.2f} ± " + ("n/a" if sd is None else f"{sd:.2f}")


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table, every cell escaped (rgpt_dist.markdown.cell)."""
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]


def stat_cell(stat: dict | None) -> str:
    """A group's statistic over seeds as 'mean ± SD', its seed count where not the paper's 3."""
    if stat is None:
        return "-"
    text = fmt(stat["mean"], stat["sd"])
    return text if stat["n"] == 3 else f"{text} (n={stat['n']})"
