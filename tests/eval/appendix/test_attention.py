"""E.9 attention statistics against attention probabilities computed by hand from the state dict
(the core's input from the traced states, block internals from tests/models/reference.py), and the
head classification on synthetic values."""
import math

import pytest
import torch

from rgpt_dist.eval.appendix import attention
from rgpt_dist.eval.appendix.common import trace
from tests.eval.appendix.conftest import R
from tests.models import reference


def hand_probabilities(u, sd, p, n_head):
    """u (B, T, d) the attention input -> P (B, H, T, T): qkv per head [q_h, k_h, v_h], causal softmax."""
    B, T, d = u.shape
    hd = d // n_head
    qkv = u @ sd[p + "qkv.weight"].T + sd[p + "qkv.bias"]
    out = []
    for h in range(n_head):
        q, k = qkv[..., h * 3 * hd: h * 3 * hd + hd], qkv[..., h * 3 * hd + hd: h * 3 * hd + 2 * hd]
        scores = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(
            torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        out.append(torch.softmax(scores, -1))
    return torch.stack(out, 1)


@torch.no_grad()
def hand_stats(model, batches, r):
    """(r, n_blocks, H, 3): entropy, P[t, t], P[t, t-1] averaged by explicit loops over the queries."""
    sd, cfg = model.state_dict(), model.cfg
    sums = torch.zeros(r, cfg.n_rec, cfg.n_head, 3, dtype=torch.float64)
    n_query = n_prev = 0
    for x, _ in batches:
        h = trace(model, x, r).h
        for i in range(1, r + 1):
            c = h[i - 1] @ sd["recurrence.proj_h.weight"].T + h[0] @ sd["recurrence.proj_pre.weight"].T
            for b in range(cfg.n_rec):
                pre = f"recurrence.blocks.{b}."
                u = reference.layer_norm(c, sd[pre + "ln_1.weight"], sd[pre + "ln_1.bias"], cfg.ln_eps)
                P = hand_probabilities(u, sd, pre + "attn.", cfg.n_head).double()
                for t in range(x.shape[1]):
                    row = P[..., t, : t + 1]                             # (B, H, t + 1): the visible keys
                    sums[i - 1, b, :, 0] += -(row * row.log()).sum(-1).sum(0)
                    sums[i - 1, b, :, 1] += P[..., t, t].sum(0)
                    if t > 0:
                        sums[i - 1, b, :, 2] += P[..., t, t - 1].sum(0)
                c = reference.block(c, sd, pre, cfg.n_head, cfg.ln_eps)
        n_query += x.numel()
        n_prev += x.shape[0] * (x.shape[1] - 1)
    return sums / torch.tensor([n_query, n_query, n_prev], dtype=torch.float64)


def test_head_stats_match_hand_attention(model, batches):
    stats = attention.head_stats(model, batches, R)
    expected = hand_stats(model, batches, R)
    assert stats.shape == (R, model.cfg.n_rec, model.cfg.n_head, 3)
    assert torch.allclose(stats, expected, atol=1e-5)
    assert float(stats[..., 0].std()) > 1e-3          # heads and steps differ: a layout error would show


@pytest.mark.parametrize("values, expected", [
    ((0.5, 0.9, 0.0), "local/sharp"),        # sharp wins over self
    ((1.5, 0.1, 0.8), "previous-token"),
    ((1.5, 0.5, 0.4), "previous-token"),     # previous-token wins over self
    ((1.5, 0.5, 0.1), "self"),
    ((4.5, 0.01, 0.01), "broadcast"),
    ((2.0, 0.35, 0.35), "general"),          # thresholds are strict
    ((1.0, 0.1, 0.1), "general"),
])
def test_classify(values, expected):
    assert attention.classify(*values) == expected


def test_summarise_stability():
    """Two steps, one block, two heads: head 0 is previous-token at step 1 and general at step 2
    (averaged: prev mass 0.4, previous-token); head 1 is broadcast at both steps."""
    stats = torch.tensor([[[[2.0, 0.1, 0.6], [4.5, 0.05, 0.05]]],
                          [[[2.0, 0.1, 0.2], [4.2, 0.05, 0.05]]]], dtype=torch.float64)
    s = attention.summarise(stats)
    assert s["class"] == [["previous-token", "broadcast"]]
    assert s["class_per_step"] == [[["previous-token", "broadcast"]], [["general", "broadcast"]]]
    assert s["stability"] == [1.0, 0.5]
    assert s["class_counts"]["broadcast"] == 1 and s["class_counts"]["general"] == 0
    assert s["mean_entropy"] == pytest.approx([3.25, 3.1])


def test_run_writes_outputs(run_analysis, model):
    res, _ = run_analysis(attention)
    assert res.figures == [res.figures[0].parent / "attention.png"]
    assert len(res.rows) == R * model.cfg.n_rec * model.cfg.n_head
