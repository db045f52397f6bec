"""Two out-of-distribution summaries of one run's frontier grid (accuracy [difficulties, steps]), the
supervision sweep's statistics (docs/thinking.md). They differ; each is named for what it computes.

    ood_cell_mean     ours: the mean accuracy over every cell beyond the training range with enough
                      steps (difficulty > train_range[1] and steps >= difficulty)
    authors_ood_best  the authors' `ood_acc` (hhchen1105/Depth-Recurrent-Transformer,
                      graph/supervision_sweep.py, read for the definition): per hop count h in
                      AUTHORS_OOD[task] = (6, 8, 10, 12), the best accuracy over steps >= h, then the
                      mean over the four hop counts

The best-over-steps statistic forgives a model that solves a hop count at 20 steps and fails at 12;
the cell mean counts both cells. Per seed each gives one number; the table reports the mean and the
sample SD over seeds (the authors' plot script prints the population SD, np.std).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

AUTHORS_OOD: dict[str, tuple[int, ...]] = {"graph": (6, 8, 10, 12)}
"""The hop counts the authors' supervision sweep averages (their OOD_HOPS); the sweep is the graph
task's only, so the other tasks have no authors' statistic."""


def ood_cell_mean(accuracy, difficulties: Sequence[int], steps: Sequence[int], train_max: int) -> float | None:
    """Ours: mean of accuracy[i, j] over cells with difficulties[i] > train_max and steps[j] >=
    difficulties[i]; None when there is no such cell. accuracy: [len(difficulties), len(steps)]."""
    acc = np.asarray(accuracy, dtype=float)
    cells = [acc[i, j] for i, d in enumerate(difficulties) for j, s in enumerate(steps) if d > train_max and s >= d]
    return float(np.mean(cells)) if cells else None


def authors_ood_best(accuracy, difficulties: Sequence[int], steps: Sequence[int], task: str) -> float | None:
    """The authors': mean over h in AUTHORS_OOD[task] of max_j accuracy[row of h, j] over steps[j] >= h;
    None for a task without their statistic, or a grid lacking one of the hop counts or any step >= it
    (their number is not defined on that grid)."""
    hops = AUTHORS_OOD.get(task)
    if hops is None or not set(hops) <= set(difficulties):
        return None
    acc = np.asarray(accuracy, dtype=float)
    best = []
    for h in hops:
        row = acc[list(difficulties).index(h)]                                    # [len(steps)]
        enough = [row[j] for j, s in enumerate(steps) if s >= h]
        if not enough:
            return None
        best.append(max(enough))
    return float(np.mean(best))


__all__ = ["AUTHORS_OOD", "ood_cell_mean", "authors_ood_best"]
