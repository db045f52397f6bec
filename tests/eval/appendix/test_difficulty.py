"""E.5 token difficulty (rgpt_dist/eval/appendix/difficulty.py) against a direct numpy computation on
per-token losses of separate reference forwards (tests/models/reference.py) and gates of the recurrence
recomputed by hand (tests/eval/appendix/test_diagnostics.hand_recurrence): sort, split, means, polyfit, corrcoef."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rgpt_dist.eval.appendix import difficulty
from tests.eval.appendix.test_diagnostics import hand_recurrence
from tests.models import reference

from .conftest import R, V


@pytest.fixture(scope="module")
def by_hand(model, batches):
    """Per target != -1 of both batches (batch by batch, row-major): losses (n, R + 1), mean gates (n, R)."""
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    keep = (y != -1).numpy()
    with torch.no_grad():
        logits = [reference.recurrent_gpt_logits(model.state_dict(), model.cfg, x, i)[..., :V] for i in range(R + 1)]
        losses = [F.cross_entropy(z.transpose(1, 2), y.clamp(min=0), reduction="none").numpy() for z in logits]
        _, _, gs = hand_recurrence(model, x, R)
    return (np.stack([loss[keep] for loss in losses], -1).astype(np.float64),
            np.stack([g.mean(-1).numpy()[keep] for g in gs], -1).astype(np.float64))


@pytest.fixture(scope="module")
def result(model, batches):
    return difficulty.difficulty_stats(*difficulty.token_values(model, batches, R))


def test_token_values(model, batches, by_hand):
    losses, gates = difficulty.token_values(model, batches, R)
    np.testing.assert_allclose(losses.numpy(), by_hand[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gates.numpy(), by_hand[1], rtol=1e-5, atol=1e-6)


def test_deciles_fit_and_correlation(result, by_hand):
    losses, gates = by_hand
    n = losses.shape[0]
    order = np.argsort(losses[:, 0], kind="stable")
    decile = np.empty(n, dtype=int)
    decile[order] = 10 * np.arange(n) // n
    assert result["n_targets"] == n == 75
    for j, dec in enumerate(result["deciles"]):
        sel = decile == j
        assert dec["n"] == sel.sum() in (7, 8)
        np.testing.assert_allclose(dec["loss"], losses[sel].mean(0), rtol=1e-5)
        assert dec["initial_loss"] == pytest.approx(losses[sel, 0].mean(), rel=1e-5)
        assert dec["improvement"] == pytest.approx((losses[sel, 0] - losses[sel, R]).mean(), abs=1e-5)
        np.testing.assert_allclose(dec["gate"][1:], gates[sel].mean(0), rtol=1e-5)
    xs = np.array([dec["initial_loss"] for dec in result["deciles"]])
    ys = np.array([dec["improvement"] for dec in result["deciles"]])
    slope, intercept = np.polyfit(xs, ys, 1)
    assert result["slope"] == pytest.approx(slope, rel=1e-6)
    assert result["intercept"] == pytest.approx(intercept, rel=1e-6)
    assert result["r2"] == pytest.approx(np.corrcoef(xs, ys)[0, 1] ** 2, rel=1e-6)
    for i in range(1, R + 1):
        assert result["gate_corr"][i] == pytest.approx(np.corrcoef(gates[:, i - 1], losses[:, 0])[0, 1], abs=1e-4)
    assert result["gate_corr"][0] is None


def test_few_tokens_leave_deciles_empty():
    """n = 7 < 10: ranks 0..6 go to deciles floor(10 k / 7) = 0, 1, 2, 4, 5, 7, 8; ties keep their order."""
    initial = torch.tensor([3.0, 1.0, 2.0, 2.0, 5.0, 0.5, 4.0], dtype=torch.float64)
    assert difficulty.decile_index(initial).tolist() == [5, 1, 2, 4, 8, 0, 7]
    losses = torch.stack([initial, initial / 2], -1)                 # r = 1: every token halves its loss
    d = difficulty.difficulty_stats(losses, torch.full((7, 1), 0.5, dtype=torch.float64))
    assert [dec["n"] for dec in d["deciles"]] == [1, 1, 1, 0, 1, 1, 0, 1, 1, 0]
    assert d["deciles"][3]["improvement"] is None and d["deciles"][3]["loss"] == [None, None]
    assert d["r2"] == pytest.approx(1.0) and d["slope"] == pytest.approx(0.5)
    assert d["gate_corr"] == [None, None]                             # constant gate: no correlation


def test_run_writes_outputs(run_analysis):
    res, data = run_analysis(difficulty)
    assert len(data["deciles"]) == 10
    assert [row["decile"] for row in res.rows] == list(range(10)) and sum(row["n"] for row in res.rows) == 75
