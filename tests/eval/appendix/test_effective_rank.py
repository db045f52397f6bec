"""E.6 effective rank (rgpt_dist/eval/appendix/effective_rank.py): the Gram route against
torch.linalg.svdvals of the stacked matrix, the effective rank on matrices of known rank, and every
per-step number against the recurrence recomputed by hand (tests/eval/appendix/test_diagnostics.hand_recurrence)
with all tokens held at once."""
import math

import numpy as np
import pytest
import torch

from rgpt_dist.eval.appendix import effective_rank as er
from tests.eval.appendix.test_diagnostics import hand_recurrence

from .conftest import R


def erank_numpy(x: torch.Tensor) -> float:
    """Roy & Vetterli from the SVD of the whole matrix, in numpy."""
    s = np.linalg.svd(x.double().numpy(), compute_uv=False)
    p = s / s.sum()
    p = p[p > 1e-15]
    return float(np.exp(-(p * np.log(p)).sum()))


@pytest.mark.parametrize("shape", [(80, 64), (10, 64)])
def test_gram_singular_values_match_svdvals(shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 3.0
    s = er.singular_values_from_gram(x.T @ x)                         # (64,): zeros past rank 10 when N = 10
    want = torch.linalg.svdvals(x)
    k = want.shape[0]
    torch.testing.assert_close(s[:k], want, rtol=1e-8, atol=1e-10 * float(want[0]))
    assert torch.all(s[k:] <= 1e-6 * want[0])


def test_effective_rank_of_known_matrices():
    eye = torch.eye(12, dtype=torch.float64)
    assert er.effective_rank(er.singular_values_from_gram(eye.T @ eye)) == pytest.approx(12.0, rel=1e-12)
    g = torch.Generator().manual_seed(5)
    u, v = torch.randn(50, generator=g, dtype=torch.float64), torch.randn(30, generator=g, dtype=torch.float64)
    one = torch.outer(u, v)                                            # (50, 30), rank 1
    assert er.effective_rank(er.singular_values_from_gram(one.T @ one)) == pytest.approx(1.0, abs=1e-6)
    p = np.array([0.75, 0.25])                                         # s = (3, 1)
    assert er.effective_rank(torch.tensor([3.0, 1.0, 0.0])) == pytest.approx(math.exp(-(p * np.log(p)).sum()))
    assert er.late_steps(6) == [4, 5, 6] and er.late_steps(3) == [2, 3] and er.late_steps(1) == [1]


def test_rank_stats_match_stacked_states(model, batches):
    d = er.rank_stats(model, batches, R)
    x = torch.cat([b[0] for b in batches])                             # same T: all 80 tokens at once
    with torch.no_grad():
        hs, _, _ = hand_recurrence(model, x, R)
    h = [s.double().reshape(-1, s.shape[-1]) for s in hs]              # (80, 64) each
    n, width = h[0].shape
    assert (d["n_tokens"], d["d"]) == (n, width) and d["late_steps"] == [2, 3]
    for i in range(R + 1):
        assert d["state_rank"][i] == pytest.approx(erank_numpy(h[i]) / min(n, width), rel=1e-6)
    late = torch.cat([h[i] - h[i - 1] for i in (2, 3)])                 # (160, 64)
    assert d["delta_rank"] == pytest.approx(erank_numpy(late) / min(late.shape), rel=1e-5)
    for i in range(1, R + 1):
        delta = h[i] - h[i - 1]
        assert d["fixed_point_delta"][i] == pytest.approx(float(delta.norm() / h[i - 1].norm()), rel=1e-5)
        if i >= 2:
            prev = h[i - 1] - h[i - 2]
            cos = (delta * prev).sum(-1) / (delta.norm(dim=-1) * prev.norm(dim=-1))
            assert d["delta_cos"][i] == pytest.approx(float(cos.mean()), abs=1e-5)
    assert d["fixed_point_delta"][0] is None and d["delta_cos"][:2] == [None, None]
    assert len(set(round(v, 3) for v in d["state_rank"])) > 1           # the steps differ


def test_run_writes_outputs(run_analysis):
    res, data = run_analysis(er)
    assert len(data["state_rank"]) == R + 1 and 0 < data["delta_rank"] <= 1
    assert [row["step"] for row in res.rows] == list(range(R + 1))


def test_nonfinite_inputs_give_nan_not_linalg_errors():
    from rgpt_dist.eval.appendix.common import svdvals
    from rgpt_dist.eval.appendix.gate_attribution import spectra
    from rgpt_dist.eval.appendix.projection import spectrum
    gram = torch.eye(4, dtype=torch.float64)
    gram[1, 2] = float("nan")
    s = er.singular_values_from_gram(gram)  # eigvalsh raised LinAlgError here
    assert s.shape == (4,) and bool(s.isnan().all()) and math.isnan(er.effective_rank(s))
    w = torch.ones(3, 5)
    w[0, 0] = float("inf")
    assert bool(svdvals(w).isnan().all()) and svdvals(w).shape == (3,)
    assert spectrum(w)["singular_values"][0] != spectrum(w)["singular_values"][0]  # NaN, not a crash
    assert er.effective_rank(torch.tensor([2.0, 0.0])) == 1.0  # finite input unchanged

    class Rec(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_h, self.gate_pre = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    model = torch.nn.Module()
    model.recurrence = Rec()
    with torch.no_grad():
        model.recurrence.gate_pre.weight[0, 0] = float("nan")
    out = spectra(model)
    assert all(math.isnan(v) for v in out["W_h"]) and not any(math.isnan(v) for v in out["W_x"])
