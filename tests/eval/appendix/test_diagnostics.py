"""Appendix E diagnostics (rgpt_dist/eval/appendix/diagnostics.py) against independent references: the model's
own all-exits losses, KL from separate forwards at each depth, and the recurrence recomputed by hand
from the parameters (block internals from tests/models/reference.py, the step equations below)."""
import csv
import json
import math

import pytest
import torch
import torch.nn.functional as F

from rgpt_dist.config import RecurrentGPTConfig
from rgpt_dist.eval.appendix.diagnostics import CKAStats, diagnose, gate_heatmap, linear_cka
from rgpt_dist.registry import build_model
from tests.models import reference

R, V, T = 4, 300, 16


@pytest.fixture(scope="module")
def model():
    """Small random model; padded head (300 -> 320 rows) and gates spread over (0, 1), not saturated."""
    cfg = RecurrentGPTConfig(vocab_size=V, block_size=32, d_model=64, n_head=4, n_pre=1, n_rec=1, n_coda=1,
                             n_loops=R, gate_bias_init=0.0, pad_vocab_multiple=64)
    m = build_model(cfg, seed=0).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
        m.recurrence.gate_out.weight.normal_(0.0, 0.5, generator=g)
        m.recurrence.gate_out.bias.normal_(0.0, 1.5, generator=g)
    return m


def batches():
    """Two batches of different sizes; the second ignores some targets (-1)."""
    g = torch.Generator().manual_seed(2)
    out = []
    for b in (2, 3):
        idx = torch.randint(0, V, (b, T + 1), generator=g)
        out.append((idx[:, :-1], idx[:, 1:].clone()))
    out[1][1][0, :5] = -1
    return out


def hand_recurrence(model, x, r):
    """h^(0..r), o^(1..r), g^(1..r) by hand from the state dict: SPEC section 1 without noise,
        h~ = [h, h_pre] W_proj^T,  o = core(h~),  g = sigmoid(f_g([LN(h), LN(h_pre)]) / tau),
        h' = g h + (1 - g) o."""
    sd, cfg, eps = model.state_dict(), model.cfg, model.cfg.ln_eps
    h = sd["embed.wte.weight"][x] + sd["embed.wpe.weight"][: x.shape[1]]
    for i in range(cfg.n_pre):
        h = reference.block(h, sd, f"prelude.{i}.", cfg.n_head, eps)
    h_pre, hs, os_, gs = h, [h], [], []
    w_proj = torch.cat([sd["recurrence.proj_h.weight"], sd["recurrence.proj_pre.weight"]], 1)   # (d, 2d)
    w_g1 = torch.cat([sd["recurrence.gate_h.weight"], sd["recurrence.gate_pre.weight"]], 1)     # (d, 2d)
    for _ in range(r):
        o = torch.cat([h, h_pre], -1) @ w_proj.T
        for i in range(cfg.n_rec):
            o = reference.block(o, sd, f"recurrence.blocks.{i}.", cfg.n_head, eps)
        z = torch.cat([reference.layer_norm(h, sd["recurrence.ln_h.weight"], sd["recurrence.ln_h.bias"], eps),
                       reference.layer_norm(h_pre, sd["recurrence.ln_pre.weight"], sd["recurrence.ln_pre.bias"], eps)], -1)
        a = F.silu(z @ w_g1.T + sd["recurrence.gate_h.bias"])
        g = torch.sigmoid((a @ sd["recurrence.gate_out.weight"].T + sd["recurrence.gate_out.bias"]) / cfg.tau)
        h = g * h + (1 - g) * o
        hs.append(h)
        os_.append(o)
        gs.append(g)
    return hs, os_, gs


def gram_cka(x, y):
    """Kornblith et al. 2019, Gram (HSIC) form: tr(K H L H) / sqrt(tr(K H K H) tr(L H L H))."""
    x, y = x.double(), y.double()
    n = x.shape[0]
    H = torch.eye(n, dtype=torch.float64) - 1.0 / n
    K, L = H @ x @ x.T @ H, H @ y @ y.T @ H
    return float((K * L).sum() / torch.sqrt((K * K).sum() * (L * L).sum()))


@pytest.mark.parametrize("r", [2, R, R + 2])
def test_exit_losses_match_all_exits(model, r):
    d = diagnose(model, batches(), r=r)
    assert d.r == r and len(d.loss) == r + 1
    with torch.no_grad():
        parts = [(model(x, y, r=r, all_exits=True).aux["exit_losses"], int((y != -1).sum())) for x, y in batches()]
    want = sum(e * n for e, n in parts) / sum(n for _, n in parts)   # target-weighted over batches
    torch.testing.assert_close(torch.tensor(d.loss), want.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("r", [3, R + 1])
def test_kl_to_final_matches_separate_forwards(model, r):
    d = diagnose(model, batches(), r=r, cka=False)
    assert d.kl_to_final[r] == pytest.approx(0.0, abs=1e-7)
    with torch.no_grad():
        kl, n = torch.zeros(r + 1, dtype=torch.float64), 0
        for x, _ in batches():
            logp_r = model(x, r=r).logits[..., :V].double().log_softmax(-1)            # (B, T, V)
            for i in range(r + 1):
                logp_i = model(x, r=i).logits[..., :V].double().log_softmax(-1)
                kl[i] += (logp_r.exp() * (logp_r - logp_i)).sum()
            n += x.numel()
    assert (kl[:-1] > 1e-4).all()
    torch.testing.assert_close(torch.tensor(d.kl_to_final, dtype=torch.float64), kl / n, rtol=1e-4, atol=1e-6)


def test_norms_gates_and_cka_match_hand_recurrence(model):
    bs = batches()
    d = diagnose(model, bs, r=R)
    x = torch.cat([b[0] for b in bs])                 # same T: Frobenius over both batches = over the concat
    with torch.no_grad():
        hs, os_, gs = hand_recurrence(model, x, R)
    for i in range(1, R + 1):
        step = hs[i] - hs[i - 1]
        assert d.update_ratio[i] == pytest.approx(float(step.norm() / (os_[i - 1] - hs[i - 1]).norm()), rel=1e-4)
        assert d.fixed_point_delta[i] == pytest.approx(float(step.norm() / hs[i - 1].norm()), rel=1e-4)
        g = gs[i - 1]
        assert d.gate_mean[i] == pytest.approx(float(g.mean()), rel=1e-5)
        assert d.gate_std[i] == pytest.approx(float(g.std()), rel=1e-4)
        assert d.gate_hi[i] == pytest.approx(float((g > 0.95).double().mean()), abs=1e-6)
        assert d.gate_lo[i] == pytest.approx(float((g < 0.05).double().mean()), abs=1e-6)
    assert 0.0 < d.update_ratio[1] < 1.0 and d.gate_hi[1] > 0 and d.gate_lo[1] > 0
    assert d.gate_mean[0] is d.update_ratio[0] is None
    flat = [h.reshape(-1, h.shape[-1]) for h in hs]
    want = [[gram_cka(a, b) for b in flat] for a in flat]
    torch.testing.assert_close(torch.tensor(d.cka), torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_linear_cka_properties():
    g = torch.Generator().manual_seed(3)
    x, y = (torch.randn(40, k, generator=g, dtype=torch.float64) for k in (6, 9))
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x, y) == pytest.approx(gram_cka(x, y), rel=1e-10)
    assert linear_cka(x @ q * 3.7 + 5.0, y) == pytest.approx(linear_cka(x, y), rel=1e-10)
    assert linear_cka(x * torch.arange(1.0, 7.0), y) != pytest.approx(linear_cka(x, y), rel=1e-3)  # not anisotropic
    assert linear_cka(x, y) < 0.9
    stats = CKAStats(3)                        # accumulated in two chunks = one pass over all rows
    z = x @ torch.randn(6, 5, generator=g, dtype=torch.float64) + 0.1 * torch.randn(40, 5, generator=g, dtype=torch.float64)
    for sl in (slice(0, 15), slice(15, 40)):
        stats.update([x[sl], y[sl], z[sl]])
    m = torch.tensor(stats.matrix(), dtype=torch.float64)
    assert torch.equal(m, m.T) and torch.equal(m.diagonal(), torch.ones(3, dtype=torch.float64))
    want = torch.tensor([[gram_cka(a, b) for b in (x, y, z)] for a in (x, y, z)], dtype=torch.float64)
    torch.testing.assert_close(m, want, rtol=1e-10, atol=1e-12)


def test_hooks_removed_and_outputs_unchanged(model, tmp_path):
    x, y = batches()[0]
    modules = [model, model.recurrence, model.recurrence.blocks[-1]]
    with torch.no_grad():
        before = model(x, y).logits.clone()
    diagnose(model, batches())
    gate_heatmap(model, x, tmp_path / "heat.png", r=2)
    with pytest.raises(Exception):
        diagnose(model, [(x, torch.zeros(1, 3, dtype=torch.long))])   # fails mid-forward: hooks must still go
    for m in modules:
        assert not m._forward_hooks and not m._forward_hooks_with_kwargs
    with torch.no_grad():
        assert torch.equal(model(x, y).logits, before)
    model.train()
    try:
        with pytest.raises(ValueError, match="eval"):
            diagnose(model, batches())
    finally:
        model.eval()


def test_outputs_written(model, tmp_path):
    d = diagnose(model, batches(), r=3)
    d.write_csv(tmp_path / "steps.csv")
    rows = list(csv.DictReader(open(tmp_path / "steps.csv")))
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3] and rows[0]["gate_mean"] == ""
    assert float(rows[2]["fixed_point_delta"]) == pytest.approx(d.fixed_point_delta[2])
    back = json.loads(d.to_json(tmp_path / "d.json"))
    assert back == json.loads((tmp_path / "d.json").read_text()) and back["loss"] == d.loss
    assert len(back["cka"]) == 4 and all(len(row) == 4 for row in back["cka"])
    paths = d.plot(tmp_path / "plots")
    assert sorted(p.name for p in paths) == ["cka.png", "diagnostics_steps.png"]
    x = batches()[0][0]
    gbar = gate_heatmap(model, x, tmp_path / "heat.png", decode=lambda ids: f"t{ids[0]}\n$", r=3)
    for p in paths + [tmp_path / "heat.png"]:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000
    with torch.no_grad():
        _, _, gs = hand_recurrence(model, x[:1], 3)
    torch.testing.assert_close(gbar, torch.stack([g[0].mean(-1) for g in gs]), rtol=1e-5, atol=1e-6)
    assert math.isfinite(sum(d.kl_to_final))
