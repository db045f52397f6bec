"""The RLT paper's accuracy metrics (J.4, J.6), from predictions, targets and the loss mask. Numpy only.

Inputs, per batch: `predictions` [B, T] (argmax ids of the logits at every position), `targets` [B, T]
and `mask` [B, T] bool (the positions the paper scores: rgpt_dist.algorithmic.batch). Every metric is
kept as integer counts (`Counts`) so that batches, and a run's validation lengths, pool exactly:
"we pool counts", and the paper recomputes its scores "from saved per-example predictions or
teacher-token counts".

- final: the last scored position of each row is right. Parity and mod-5: the final label (their
  only scored position); S5: the final state. Denominator: rows with at least one scored position.
- token: every scored position, pooled over rows. S5: prefix-token accuracy (each running product);
  addition: teacher-forced answer-token accuracy (digits, spaces, brackets and EOS; no prompt, no
  padding); parity and mod-5: equal to `final` (one label per row).
- sequence: rows whose every scored position is right (S5's whole-sequence accuracy).

Which one a task's headline number is (Table 3, Figure 12): `PRIMARY` (final-label or final-state
accuracy; addition's token accuracy). Chance (uniform prediction, the dotted lines of Figure 12):
`CHANCE`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

METRICS = ("final", "token", "sequence")
PRIMARY = {"parity": "final", "s5_standard": "final", "s5_swaps": "final", "mod5_flat": "final",
           "mod5_brackets": "final", "addition": "token"}
"""The metric the paper reports for each task (Table 3: 'Addition reports teacher-forced token
accuracy; formal tasks report final-label or final-state accuracy')."""
CHANCE = {"parity": 0.5, "s5_standard": 1 / 120, "s5_swaps": 1 / 120, "mod5_flat": 0.2, "mod5_brackets": 0.2}
"""Uniform-prediction accuracy of the primary metric (Figure 12's dotted lines); addition has none."""
METRIC_NAMES = {"final": "final-label / final-state accuracy", "token": "token accuracy (S5: prefix-token; "
                "addition: teacher-forced answer-token)", "sequence": "whole-sequence accuracy"}


@dataclass
class Counts:
    """Correct / total counts of the three metrics; `+` pools them."""
    final_correct: int = 0
    final_total: int = 0
    token_correct: int = 0
    token_total: int = 0
    sequence_correct: int = 0
    sequence_total: int = 0

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values())))

    def accuracy(self, metric: str) -> float | None:
        """correct / total of one metric; None when nothing was scored."""
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}: expected one of {', '.join(METRICS)}")
        total = getattr(self, f"{metric}_total")
        return getattr(self, f"{metric}_correct") / total if total else None

    def to_dict(self) -> dict:
        """The counts and the three accuracies (fractions in [0, 1], None where undefined)."""
        return {**asdict(self), **{m: self.accuracy(m) for m in METRICS}}


def _arrays(predictions, targets, mask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    predictions, targets, mask = np.asarray(predictions), np.asarray(targets), np.asarray(mask)
    if predictions.ndim != 2 or predictions.shape != targets.shape or predictions.shape != mask.shape:
        raise ValueError(f"predictions {predictions.shape}, targets {targets.shape} and mask {mask.shape} "
                         "must be the same [B, T] shape")
    if mask.dtype != bool:
        raise ValueError(f"mask must be boolean, got {mask.dtype}")
    return predictions, targets, mask


def count(predictions, targets, mask) -> Counts:
    """The counts of one batch: predictions, targets [B, T] ints, mask [B, T] bool."""
    predictions, targets, mask = _arrays(predictions, targets, mask)
    right = (predictions == targets) & mask                       # [B, T]
    scored_rows = mask.any(axis=1)                                # [B]
    t = mask.shape[1]
    last = t - 1 - np.argmax(mask[:, ::-1], axis=1)               # [B] index of the last scored position
    rows = np.arange(mask.shape[0])
    final_right = right[rows, last] & scored_rows
    all_right = (right == mask).all(axis=1) & scored_rows         # every scored position right
    return Counts(final_correct=int(final_right.sum()), final_total=int(scored_rows.sum()),
                  token_correct=int(right.sum()), token_total=int(mask.sum()),
                  sequence_correct=int(all_right.sum()), sequence_total=int(scored_rows.sum()))


def primary_metric(task: str) -> str:
    """The metric reported for `task` (PRIMARY); ValueError naming an unknown task."""
    if task not in PRIMARY:
        raise ValueError(f"unknown task {task!r}: expected one of {', '.join(sorted(PRIMARY))}")
    return PRIMARY[task]
