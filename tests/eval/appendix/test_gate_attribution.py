"""E.7 gate attribution: the jvp gradient x input against explicit autograd on the gate logit written
out from the state dict, the pooled statistics against a direct computation over all entries, and
the spectra against torch.linalg.svdvals."""
import torch
import torch.nn.functional as F

from rgpt_dist.eval.appendix import gate_attribution as ga
from rgpt_dist.eval.appendix.common import trace
from tests.eval.appendix.conftest import R
from tests.models import reference


def inputs(model, x, i):
    """(x^, h^) of step i from the trace, normalised by hand from the state dict: each (B, T, d)."""
    sd, eps, h = model.state_dict(), model.cfg.ln_eps, trace(model, x, R).h
    return (reference.layer_norm(h[i - 1], sd["recurrence.ln_h.weight"], sd["recurrence.ln_h.bias"], eps),
            reference.layer_norm(h[0], sd["recurrence.ln_pre.weight"], sd["recurrence.ln_pre.bias"], eps))


def hand_logit(sd, tau, x_hat, h_hat):
    """z = (W_out silu(W_x x^ + W_h h^ + b) + b_out) / tau, weights from the state dict."""
    a = x_hat @ sd["recurrence.gate_h.weight"].T + h_hat @ sd["recurrence.gate_pre.weight"].T \
        + sd["recurrence.gate_h.bias"]
    return (F.silu(a) @ sd["recurrence.gate_out.weight"].T + sd["recurrence.gate_out.bias"]) / tau


def test_closed_form_equals_explicit_gradient_times_input(model, batches):
    sd, tau = model.state_dict(), model.cfg.tau
    x_hat, h_hat = inputs(model, batches[0][0], 2)
    with torch.no_grad():
        a_x, a_h = ga.step_attribution(model.recurrence, x_hat, h_hat)
    xs, hs = x_hat[:1, :4].clone().requires_grad_(), h_hat[:1, :4].clone().requires_grad_()  # (1, 4, d) slice
    z = hand_logit(sd, tau, xs, hs)                                     # (1, 4, d)
    for j in (0, 7, 63):   # tokens are independent: one backward gives dz_j(t)/d input(t) for every t
        gx, gh = torch.autograd.grad(z[..., j].sum(), (xs, hs), retain_graph=True)
        assert torch.allclose(a_x[:1, :4, j], (gx * xs).sum(-1), atol=1e-5)
        assert torch.allclose(a_h[:1, :4, j], (gh * hs).sum(-1), atol=1e-5)


def test_pooled_statistics(model, batches):
    """Pooling over all (token, channel) entries of both batches (the inputs normalised by the model's
    own LayerNorms, so that near-ties of |A_x| and |A_h| compare identically)."""
    rec, steps = model.recurrence, ga.attribution(model, batches, R)
    assert len(steps) == R
    for i, s in enumerate(steps, start=1):
        with torch.no_grad():
            hs = [trace(model, x, R).h for x, _ in batches]
            parts = [ga.step_attribution(rec, rec.ln_h(h[i - 1]), rec.ln_pre(h[0])) for h in hs]
        a_x = torch.cat([p[0].flatten() for p in parts]).double()      # every (token, channel) entry
        a_h = torch.cat([p[1].flatten() for p in parts]).double()
        vx, vh = a_x.var(unbiased=False), a_h.var(unbiased=False)
        assert abs(s["share_state"] - vx / (vx + vh)) < 1e-9
        assert abs(s["share_state"] + s["share_anchor"] - 1.0) < 1e-12
        assert abs(s["x_dominance"] - (a_x.abs() > a_h.abs()).double().mean()) < 1e-12
        assert abs(s["sign_agreement"] - (a_x.sign() == a_h.sign()).double().mean()) < 1e-12
        assert 0.0 < s["x_dominance"] < 1.0


def test_spectra(model):
    sv = ga.spectra(model)
    for name, w in (("W_x", model.recurrence.gate_h.weight), ("W_h", model.recurrence.gate_pre.weight)):
        s = torch.tensor(sv[name], dtype=torch.float64)
        assert torch.allclose(s, torch.linalg.svdvals(w.detach().double()))
        assert torch.allclose(s.square().sum(), w.detach().double().square().sum())   # ||W||_F^2 = sum s^2
        assert bool((s[:-1] >= s[1:]).all())


def test_run_writes_outputs(run_analysis):
    res, data = run_analysis(ga)
    assert [row["step"] for row in res.rows] == list(range(1, R + 1))
    assert data["leading_ratio"] == data["singular_values"]["W_x"][0] / data["singular_values"]["W_h"][0]
