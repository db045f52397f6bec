"""E.3: update dynamics, the proposal against the update the gate lets through.

Per step i = 1..r, with o^(i) the shared core's proposal, h^(i) the state after step i (h^(0) = h_pre)
and Delta^(i) = h^(i) - h^(i-1) the applied update, every vector (d,) one token's:

    proposal_norm[i]   mean over tokens of ||o^(i)||_2
    update_norm[i]     mean over tokens of ||Delta^(i)||_2
    proposal_cos[i]    mean over tokens of cos(o^(i), h^(i-1))
    state_cos[i]       mean over tokens of cos(h^(i), h^(i-1))
    update_cos[i]      mean over tokens of cos(Delta^(i), Delta^(i-1)), i >= 2 (successive applied updates)
    relative_update[i] ||Delta^(i)||_F / ||h^(i-1)||_F, Frobenius over all tokens (= Eq. 7's delta_fp)
    gain[i]            (loss[i-1] - loss[i]) / relative_update[i]: loss decrease per unit of relative
                       state change (our definition; the paper plots a "gain" without a formula)
    loss[i], i = 0..r  exit loss of coda + head at h^(i), mean over targets != -1

"Tokens" are all B x T positions of all batches (targets -1 included: the state does not depend on
them); means are totals accumulated in float64 over every batch divided by the token count.
cos(a, b) = a.b / max(||a|| ||b||, 1e-8) (torch.nn.functional.cosine_similarity). Undefined entries
(step 0; update_cos at step 1; gain when the state did not move) are None.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from rgpt_dist.eval.appendix.common import Context, Result, check_model, exit_losses, figure, fmt, save_figure, trace

NAME = "update_dynamics"
TITLE = "E.3: update dynamics (proposal and applied-update norms, cosines, gain)"
NEEDS: tuple[str, ...] = ()

MEAN_FIELDS = ("proposal_norm", "update_norm", "proposal_cos", "state_cos", "update_cos")
STEP_FIELDS = ("loss",) + MEAN_FIELDS + ("relative_update", "gain")


@dataclasses.dataclass
class UpdateDynamics:
    """Per-step lists of length r + 1 (index = step; None where undefined, see the module docstring)."""

    r: int
    n_tokens: int
    n_targets: int
    loss: list[float]
    proposal_norm: list[float | None]
    update_norm: list[float | None]
    proposal_cos: list[float | None]
    state_cos: list[float | None]
    update_cos: list[float | None]
    relative_update: list[float | None]
    gain: list[float | None]


def _batch_sums(model, x, y, r: int) -> dict[str, list[float]]:
    """One batch's totals (Python floats = float64), each a list over steps 0..r: the token sums of
    MEAN_FIELDS, the squared Frobenius norms `update_sq`, `prev_sq`, and the summed exit losses `loss`."""
    tr = trace(model, x, r)
    h = [s.double() for s in tr.h]                                   # r + 1 x (B, T, d)
    sums = {k: [0.0] * (r + 1) for k in MEAN_FIELDS + ("update_sq", "prev_sq", "loss")}
    for i in range(r + 1):
        sums["loss"][i] = float(exit_losses(model, tr.h[i], y).double().sum())
        if i == 0:
            continue
        o, delta = tr.o[i].double(), h[i] - h[i - 1]                 # (B, T, d)
        sums["proposal_norm"][i] = float(o.norm(dim=-1).sum())
        sums["update_norm"][i] = float(delta.norm(dim=-1).sum())
        sums["proposal_cos"][i] = float(F.cosine_similarity(o, h[i - 1], dim=-1).sum())
        sums["state_cos"][i] = float(F.cosine_similarity(h[i], h[i - 1], dim=-1).sum())
        if i >= 2:
            sums["update_cos"][i] = float(F.cosine_similarity(delta, h[i - 1] - h[i - 2], dim=-1).sum())
        sums["update_sq"][i] = float(delta.square().sum())
        sums["prev_sq"][i] = float(h[i - 1].square().sum())
    return sums


@torch.no_grad()
def update_dynamics(model, batches, r: int) -> UpdateDynamics:
    """The per-step quantities of the module docstring over all `batches` [(x, y), each (B, T)]."""
    totals, n_tokens, n_targets = None, 0, 0
    for x, y in batches:
        sums = _batch_sums(model, x, y, r)
        totals = sums if totals is None else {k: [a + b for a, b in zip(totals[k], v)] for k, v in sums.items()}
        n_tokens += x.numel()
        n_targets += int((y != -1).sum())
    if not n_targets:
        raise ValueError("the batches hold no targets != -1")
    loss = [v / n_targets for v in totals["loss"]]
    means = {k: [None] + [v / n_tokens for v in totals[k][1:]] for k in MEAN_FIELDS}
    means["update_cos"][1] = None
    relative = [None] + [math.sqrt(u / p) for u, p in zip(totals["update_sq"][1:], totals["prev_sq"][1:])]
    gain = [None] + [(loss[i - 1] - loss[i]) / relative[i] if relative[i] > 0 else None for i in range(1, r + 1)]
    return UpdateDynamics(r=r, n_tokens=n_tokens, n_targets=n_targets, loss=loss, relative_update=relative,
                          gain=gain, **means)


def _summary(d: UpdateDynamics) -> list[str]:
    cols = MEAN_FIELDS + ("gain",)
    lines = ["| step | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    lines += [f"| {i} | " + " | ".join(fmt(getattr(d, k)[i]) for k in cols) + " |" for i in range(1, d.r + 1)]
    prop, upd = d.proposal_norm[1:], d.update_norm[1:]
    gains = [(g, i) for i, g in enumerate(d.gain) if g is not None]
    peak = f"; the gain peaks at step {max(gains)[1]} ({max(gains)[0]:.4g})" if gains else ""
    lines += ["", f"Over steps 1..{d.r} the proposal norm stays within [{min(prop):.4g}, {max(prop):.4g}] "
              f"(max / min {max(prop) / min(prop):.3g}) while the applied update goes from {upd[0]:.4g} to "
              f"{upd[-1]:.4g}; the proposal cosine goes from "
              f"{d.proposal_cos[1]:.3g} to {d.proposal_cos[-1]:.3g}{peak}."]
    return lines


def _plot(d: UpdateDynamics, path):
    steps = list(range(1, d.r + 1))
    fig = figure((14, 4.2))
    axes = fig.subplots(1, 3)
    panels = [("(a) L2 norms (mean over tokens)", [("proposal ||o||", d.proposal_norm),
                                                   ("applied ||dh||", d.update_norm)]),
              ("(b) cosine similarity (mean over tokens)", [("cos(o, h_prev)", d.proposal_cos),
                                                            ("cos(h, h_prev)", d.state_cos),
                                                            ("cos(dh, dh_prev)", d.update_cos)]),
              ("(c) gain: loss drop / relative update", [("gain", d.gain)])]
    for ax, (title, lines) in zip(axes, panels):
        for name, values in lines:
            pts = [(i, values[i]) for i in steps if values[i] is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel("recurrence step")
        ax.set_xticks(steps)
        ax.legend()
    return save_figure(fig, path)


def run(ctx: Context) -> Result:
    r = check_model(ctx.model, ctx.r)
    d = update_dynamics(ctx.model, ctx.batches, r)
    rows = [{"step": i, **{k: getattr(d, k)[i] for k in STEP_FIELDS}} for i in range(r + 1)]
    ctx.out.mkdir(parents=True, exist_ok=True)
    figures = [_plot(d, ctx.out / f"{NAME}.png")]
    result = Result(NAME, TITLE, dataclasses.asdict(d), rows, _summary(d), figures)
    result.save(ctx.out)
    return result
