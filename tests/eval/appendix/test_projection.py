"""E.8 projection halves against direct computations with torch on the weights."""
import math

import pytest
import torch

from rgpt_dist.config import RecurrentGPTConfig
from rgpt_dist.eval.appendix import projection
from rgpt_dist.registry import build_model


def test_projection_stats(model):
    st = projection.projection_stats(model)
    w_x = model.recurrence.proj_h.weight.detach().double()
    w_h = model.recurrence.proj_pre.weight.detach().double()
    d = w_x.shape[0]
    cos = torch.stack([w_x[j] @ w_h[j] / (w_x[j].norm() * w_h[j].norm()) for j in range(d)])
    assert torch.allclose(torch.tensor(st["row_cosine"], dtype=torch.float64), cos)
    assert math.isclose(st["cosine_mean"], float(cos.mean()), abs_tol=1e-12)
    assert st["cosine_aligned"] == sum(float(c) > 0.5 for c in cos) / d
    edges, counts = st["cosine_hist"]["edges"], st["cosine_hist"]["counts"]
    assert sum(counts) == d
    assert counts == [sum(lo <= float(c) < hi for c in cos) for lo, hi in zip(edges, edges[1:])]
    for name, w in (("W_x", w_x), ("W_h", w_h)):
        s = torch.linalg.svd(w).S                                       # independent of svdvals
        energy = [float((s[:k] ** 2).sum() / (s ** 2).sum()) for k in range(1, d + 1)]
        p = s / s.sum()
        assert torch.allclose(torch.tensor(st[name]["singular_values"], dtype=torch.float64), s)
        assert torch.allclose(torch.tensor(st[name]["energy"], dtype=torch.float64),
                              torch.tensor(energy, dtype=torch.float64))
        assert st[name]["dims_90"] == next(k for k, e in enumerate(energy, start=1) if e >= 0.9)
        assert math.isclose(st[name]["effective_rank"], math.exp(-sum(float(q * q.log()) for q in p)), rel_tol=1e-9)
        assert 1 < st[name]["dims_90"] < d and 1 < st[name]["effective_rank"] < d
    for name in ("proj_h", "proj_pre", "gate_h", "gate_pre"):
        w = getattr(model.recurrence, name).weight.detach().double()
        assert math.isclose(st["frobenius"][name], math.sqrt(float((w * w).sum())), rel_tol=1e-12)


def test_needs_two_halves():
    cfg = RecurrentGPTConfig(vocab_size=64, block_size=8, d_model=16, n_head=2, n_pre=1, n_rec=1, n_coda=1,
                             n_loops=2, injection="state")
    with pytest.raises(ValueError, match="no two-half projection"):
        projection.projection_stats(build_model(cfg, seed=0).eval())


def test_run_writes_outputs(run_analysis, model):
    res, _ = run_analysis(projection)
    assert len(res.rows) == model.cfg.d_model
