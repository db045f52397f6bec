"""E.7: how much of the gate logit comes from the current state and how much from the prelude anchor.

At step i = 1..r the gate logit of every token is (GatedRecurrence, Eq. 5)

    z = gate_out(silu(W_x x^ + W_h h^ + b)) / tau            (B, T, d)
    x^ = LN_h(h^(i-1)),  h^ = LN_pre(h_pre)                    the two normalised inputs (B, T, d)
    W_x = gate_h.weight, W_h = gate_pre.weight (d, d),  b = gate_h.bias

(z includes 1 / tau: it is the logit the sigmoid reads; every quantity below is invariant to it.)
Attribution by gradient x input at the level of the two normalised inputs, per token and channel j:

    A_x[j] = sum_k (dz_j / dx^_k) x^_k,    A_h[j] = sum_k (dz_j / dh^_k) h^_k

Since z is a per-token function, A_x for all j at once is the Jacobian-vector product of z along
x^ with tangent x^, here in closed form (exact; the tests check it against autograd):

    u = W_x x^ + W_h h^ + b,   A_x = W_out (silu'(u) * W_x x^) / tau,   A_h = W_out (silu'(u) * W_h h^) / tau
    silu'(u) = sigmoid(u) (1 + u (1 - sigmoid(u))),   W_out = gate_out.weight
Per step, pooled over every (token, channel) entry of every batch (n = tokens x d entries; the
variance is the population variance over those entries, accumulated as float64 sums):

    share_state   = var(A_x) / (var(A_x) + var(A_h)),  share_anchor = 1 - share_state   (Fig. 15(a))
    x_dominance   = fraction of entries with |A_x| > |A_h|                               (Fig. 15(b))
    sign_agreement = fraction of entries with sign(A_x) == sign(A_h)                     (Fig. 15(b))

and from the weights alone the singular values of W_x and W_h (Fig. 15(c)) and the ratio of their
leading singular values s_1(W_x) / s_1(W_h). The paper's "variance each half explains" is not
defined further; the variance of the two gradient x input terms is our reading of it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rgpt_dist.eval.appendix.common import Context, Result, check_model, figure, save_figure, svdvals, trace

NAME = "gate_attribution"
TITLE = "E.7: gate attribution, current state vs prelude anchor, and the W_x / W_h spectra"
NEEDS: tuple[str, ...] = ()
TOP = 5  # leading singular values shown in the summary


def step_attribution(rec, x_hat: torch.Tensor, h_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rec: model.recurrence; x_hat, h_hat: (B, T, d) normalised inputs -> (A_x, A_h), each (B, T, d)."""
    w_x, w_h = F.linear(x_hat, rec.gate_h.weight), F.linear(h_hat, rec.gate_pre.weight)   # (B, T, d)
    u = w_x + w_h + rec.gate_h.bias
    s = torch.sigmoid(u)
    slope = s * (1 + u * (1 - s))                                                       # silu'(u)
    return (F.linear(slope * w_x, rec.gate_out.weight) / rec.tau,
            F.linear(slope * w_h, rec.gate_out.weight) / rec.tau)


class _Moments:
    """Running float64 totals of one step's attribution entries."""

    def __init__(self):
        self.n = 0
        self.sum_x = self.sq_x = self.sum_h = self.sq_h = 0.0
        self.dominant = self.agree = 0

    def update(self, a_x: torch.Tensor, a_h: torch.Tensor) -> None:
        a_x, a_h = a_x.double(), a_h.double()
        self.n += a_x.numel()
        self.sum_x += float(a_x.sum())
        self.sq_x += float(a_x.square().sum())
        self.sum_h += float(a_h.sum())
        self.sq_h += float(a_h.square().sum())
        self.dominant += int((a_x.abs() > a_h.abs()).sum())
        self.agree += int((torch.sign(a_x) == torch.sign(a_h)).sum())

    def finish(self) -> dict[str, float]:
        var_x = self.sq_x / self.n - (self.sum_x / self.n) ** 2
        var_h = self.sq_h / self.n - (self.sum_h / self.n) ** 2
        return {"var_state": var_x, "var_anchor": var_h, "share_state": var_x / (var_x + var_h),
                "share_anchor": var_h / (var_x + var_h), "x_dominance": self.dominant / self.n,
                "sign_agreement": self.agree / self.n}


@torch.no_grad()
def attribution(model, batches, r: int) -> list[dict[str, float]]:
    """Per step 1..r (list index i - 1) the pooled statistics of the module docstring."""
    rec = model.recurrence
    moments = [_Moments() for _ in range(r)]
    for x, _ in batches:
        h = trace(model, x, r).h                                       # r + 1 x (B, T, d)
        h_hat = rec.ln_pre(h[0])
        for i in range(1, r + 1):
            moments[i - 1].update(*step_attribution(rec, rec.ln_h(h[i - 1]), h_hat))
    return [m.finish() for m in moments]


@torch.no_grad()
def spectra(model) -> dict[str, list[float]]:
    """Singular values (descending) of the gate's first-layer halves W_x = gate_h.weight, W_h = gate_pre.weight."""
    rec = model.recurrence
    return {"W_x": svdvals(rec.gate_h.weight).tolist(), "W_h": svdvals(rec.gate_pre.weight).tolist()}


def run(ctx: Context) -> Result:
    r = check_model(ctx.model, ctx.r)
    steps = attribution(ctx.model, ctx.batches, r)
    sv = spectra(ctx.model)
    ratio = sv["W_x"][0] / sv["W_h"][0]
    data = {"r": r, "steps": steps, "singular_values": sv, "leading_ratio": ratio}
    rows = [{"step": i, **s} for i, s in enumerate(steps, start=1)]
    summary = ["| step | state share | anchor share | x-dominance | sign agreement |", "|---|---|---|---|---|"]
    summary += [f"| {i} | {s['share_state']:.3f} | {s['share_anchor']:.3f} | {s['x_dominance']:.3f} | "
                f"{s['sign_agreement']:.3f} |" for i, s in enumerate(steps, start=1)]
    summary.append(f"Leading singular values: W_x {', '.join(f'{v:.3g}' for v in sv['W_x'][:TOP])}; "
                   f"W_h {', '.join(f'{v:.3g}' for v in sv['W_h'][:TOP])} (ratio {ratio:.3f}).")
    first, last = steps[0]["share_state"], steps[-1]["share_state"]
    trend = "grows" if last > first else "does not grow"
    summary.append(f"The current state's share of the gate-logit variance {trend}: {first:.1%} at step 1, "
                   f"{last:.1%} at step {r}; W_x's leading singular value is {ratio:.2f}x W_h's.")
    result = Result(NAME, TITLE, data, rows, summary, [_plot(steps, sv, ctx.out / f"{NAME}.png")])
    result.save(ctx.out)
    return result


def _plot(steps: list[dict[str, float]], sv: dict[str, list[float]], path):
    """(a) variance shares per step, (b) x-dominance and sign agreement per step, (c) W_x / W_h spectra."""
    xs = range(1, len(steps) + 1)
    fig = figure((14, 4))
    ax_share, ax_token, ax_sv = fig.subplots(1, 3)
    for ax, keys, title in ((ax_share, ("share_state", "share_anchor"), "(a) gate-logit variance share"),
                            (ax_token, ("x_dominance", "sign_agreement"), "(b) token level")):
        for key in keys:
            ax.plot(xs, [s[key] for s in steps], marker="o", label=key)
        ax.set_xticks(list(xs))
        ax.set_xlabel("recurrence step")
        ax.set_ylim(0.0, 1.0)
        ax.set_title(title)
        ax.legend()
    for name, values in sv.items():
        ax_sv.plot(range(1, len(values) + 1), values, label=name)
    ax_sv.set_xlabel("index")
    ax_sv.set_ylabel("singular value")
    ax_sv.set_title("(c) gate first-layer spectra")
    ax_sv.legend()
    return save_figure(fig, path)
