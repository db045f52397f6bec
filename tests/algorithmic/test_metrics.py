"""The paper's metrics (J.4) on hand-made prediction arrays whose counts are worked out by hand here:
final-label / final-state = the last scored position of each row; token (S5 prefix-token, addition
teacher-forced answer-token) = every scored position, counts pooled; whole-sequence = every scored
position of a row right."""
from __future__ import annotations

import numpy as np
import pytest

from rgpt_dist.algorithmic.metrics import Counts, count, primary_metric

X = -100   # unscored target


def _arrays(rows):
    """rows: (predictions, targets) lists of equal length; the mask is targets != X."""
    predictions = np.array([p for p, _ in rows])
    targets = np.array([t for _, t in rows])
    return predictions, targets, targets != X


def test_final_token_and_sequence_counts_by_hand():
    predictions, targets, mask = _arrays([
        ([9, 1, 2, 3, 0], [X, 1, 2, 3, X]),   # all 3 scored right; last scored (pos 3) right
        ([0, 0, 4, 0, 6], [X, X, 4, 5, 6]),   # 2 of 3 right; last (pos 4) right; not whole
        ([0, 8, 0, 0, 0], [X, 7, X, X, X]),   # 0 of 1; last scored (pos 1) wrong
        ([3, 3, 3, 3, 3], [X, X, X, X, X]),   # nothing scored: in no denominator
        ([5, 6, 7, 1, 0], [5, 6, 7, 2, X]),   # 3 of 4; the last scored (pos 3) wrong, the earlier right
    ])
    c = count(predictions, targets, mask)
    assert (c.final_correct, c.final_total) == (2, 4)
    assert (c.token_correct, c.token_total) == (3 + 2 + 0 + 3, 3 + 3 + 1 + 4)
    assert (c.sequence_correct, c.sequence_total) == (1, 4)
    assert c.accuracy("final") == 0.5 and c.accuracy("token") == 8 / 11 and c.accuracy("sequence") == 0.25


def test_unscored_positions_never_count_even_when_they_match():
    predictions, targets, mask = _arrays([([4, 4, 1], [X, X, 0])])
    targets_with_match = np.array([[4, 4, 0]])            # positions 0, 1 equal the predictions ...
    c = count(predictions, targets_with_match, mask)      # ... but the mask leaves them out
    assert (c.token_correct, c.token_total, c.final_correct, c.sequence_correct) == (0, 1, 0, 0)


def test_one_label_per_row_makes_final_equal_token_accuracy():
    """Parity and mod-5 score one final label per example."""
    predictions, targets, mask = _arrays([([0, 0, 1], [X, X, 1]), ([0, 0, 0], [X, X, 1]), ([1, 1, 0], [X, X, 0])])
    c = count(predictions, targets, mask)
    assert c.accuracy("final") == c.accuracy("token") == c.accuracy("sequence") == 2 / 3


def test_counts_pool_across_batches_not_batch_means():
    """Addition pools answer-token counts: 1/1 then 0/3 is 1/4, not the mean of 100% and 0%."""
    first = count(*_arrays([([0, 7], [X, 7])]))
    second = count(*_arrays([([0, 1, 1, 1], [X, 2, 2, 2])]))
    pooled = first + second
    assert (pooled.token_correct, pooled.token_total) == (1, 4) and pooled.accuracy("token") == 0.25
    assert (pooled.final_correct, pooled.final_total) == (1, 2)
    assert Counts().accuracy("token") is None          # nothing scored: undefined, not 0


def test_primary_metric_is_the_papers_per_task_choice():
    assert primary_metric("addition") == "token"
    assert {primary_metric(t) for t in ("parity", "s5_standard", "s5_swaps", "mod5_flat", "mod5_brackets")} == {"final"}
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        primary_metric("nope")


@pytest.mark.parametrize("shapes", [((2, 3), (2, 3), (2, 4)), ((2, 3), (3, 3), (2, 3)), ((6,), (6,), (6,))])
def test_mismatched_or_flat_arrays_are_refused(shapes):
    p, t, m = (np.zeros(s, dtype=np.int64) for s in shapes)
    with pytest.raises(ValueError, match="must be the same"):
        count(p, t, m.astype(bool))
    with pytest.raises(ValueError, match="unknown metric"):
        Counts().accuracy("bleu")
