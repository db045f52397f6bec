"""E.3 update dynamics (rgpt_dist/eval/appendix/update_dynamics.py) against the recurrence recomputed by
hand from the state dict (tests/eval/appendix/test_diagnostics.hand_recurrence) and exit losses of separate
reference forwards at each depth (tests/models/reference.py), with per-token norms and cosines
written out."""

import pytest
import torch
import torch.nn.functional as F

from rgpt_dist.eval.appendix import update_dynamics
from tests.eval.appendix.test_diagnostics import hand_recurrence
from tests.models import reference

from .conftest import R, V


def cos(a, b):
    """Per-token cosine of (N, d) rows."""
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


@pytest.fixture(scope="module")
def by_hand(model, batches):
    """States h^(0..R), proposals o^(1..R) as (N, d) float64 over all 80 tokens, and exit losses L^(0..R)."""
    x = torch.cat([b[0] for b in batches])                             # same T: tokens of both batches
    y = torch.cat([b[1] for b in batches])
    with torch.no_grad():
        hs, os_, _ = hand_recurrence(model, x, R)
        logits = [reference.recurrent_gpt_logits(model.state_dict(), model.cfg, x, i)[..., :V] for i in range(R + 1)]
        loss = [F.cross_entropy(z.flatten(0, 1), y.flatten(), ignore_index=-1).item() for z in logits]
    flat = lambda t: t.double().reshape(-1, t.shape[-1])  # noqa: E731
    return [flat(h) for h in hs], [None] + [flat(o) for o in os_], loss


@pytest.fixture(scope="module")
def result(model, batches):
    return update_dynamics.update_dynamics(model, batches, R)


def test_norms_and_cosines(result, by_hand):
    h, o, _ = by_hand
    assert result.n_tokens == h[0].shape[0] == 80
    for i in range(1, R + 1):
        delta = h[i] - h[i - 1]
        assert result.proposal_norm[i] == pytest.approx(float(o[i].norm(dim=-1).mean()), rel=1e-5)
        assert result.update_norm[i] == pytest.approx(float(delta.norm(dim=-1).mean()), rel=1e-5)
        assert result.proposal_cos[i] == pytest.approx(float(cos(o[i], h[i - 1]).mean()), abs=1e-5)
        assert result.state_cos[i] == pytest.approx(float(cos(h[i], h[i - 1]).mean()), abs=1e-5)
        assert result.relative_update[i] == pytest.approx(float(delta.norm() / h[i - 1].norm()), rel=1e-5)
        if i >= 2:
            assert result.update_cos[i] == pytest.approx(float(cos(delta, h[i - 1] - h[i - 2]).mean()), abs=1e-5)
    assert result.update_cos[1] is None and all(getattr(result, k)[0] is None for k in update_dynamics.MEAN_FIELDS)
    assert result.update_norm[1] < result.proposal_norm[1]           # the gate lets part of the proposal through


def test_losses_and_gain(result, by_hand):
    h, _, loss = by_hand
    assert result.n_targets == 75
    torch.testing.assert_close(torch.tensor(result.loss), torch.tensor(loss), rtol=1e-5, atol=1e-5)
    for i in range(1, R + 1):
        relative = float((h[i] - h[i - 1]).norm() / h[i - 1].norm())
        assert result.gain[i] == pytest.approx((loss[i - 1] - loss[i]) / relative, rel=1e-3, abs=2e-5)
    assert result.gain[0] is None


def test_run_writes_outputs(run_analysis):
    res, data = run_analysis(update_dynamics)
    assert data["r"] == R and len(data["gain"]) == R + 1
    assert [row["step"] for row in res.rows] == list(range(R + 1))
