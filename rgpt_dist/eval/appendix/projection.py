"""E.8: the two halves of the recurrent projection W_proj = [W_x | W_h] (weights only, no data).

W_proj [h^(i-1), h_pre] = W_x h^(i-1) + W_h h_pre with W_x = recurrence.proj_h.weight and
W_h = recurrence.proj_pre.weight, each (d, d) (output features x input features):

    row_cosine[j]   cos(W_x[j, :], W_h[j, :]), j = 0..d-1: do the halves read the same direction of
                    their inputs into output feature j (> 0), or the difference (< 0)?
                    reported: mean, fraction > 0.5, histogram over [-1, 1] (COSINE_BINS bins)
    s(W)            singular values, descending (Fig. 16(a))
    energy(W)[k]    sum_{m <= k} s_m^2 / sum_m s_m^2, cumulative energy (Fig. 16(b)); dims_90 = the
                    number of leading directions whose energy reaches ENERGY (90%)
    effective_rank  exp(-sum_m p_m log p_m), p = s / sum(s) (Roy & Vetterli 2007)
    frobenius       ||W||_F of the four halves: proj_h, proj_pre (W_proj) and gate_h, gate_pre (the
                    gate's first layer, E.7's W_x / W_h) (Fig. 16(c))

CSV rows: one per index k = 0..d-1 with row_cosine[k] and, for both halves, s_k and energy[k].
Only the full model has two halves (injection = "concat").
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rgpt_dist.eval.appendix.common import Context, Result, check_model, figure, save_figure, svdvals

NAME = "projection"
TITLE = "E.8: the two W_proj halves (state W_x and anchor W_h)"
NEEDS: tuple[str, ...] = ()
ENERGY = 0.9
COSINE_BINS = 20
ALIGNED = 0.5       # a row counts as aligned above this cosine
ORTHOGONAL = 0.1    # the summary calls the halves near-orthogonal when |mean row cosine| is below this


def spectrum(w: torch.Tensor) -> dict[str, object]:
    """w: (d_out, d_in) -> singular values, cumulative energy, dims to reach ENERGY, effective rank."""
    s = svdvals(w)                                                     # (min(d_out, d_in),)
    energy = (s.square().cumsum(0) / s.square().sum())
    p = s / s.sum()
    return {"singular_values": s.tolist(), "energy": energy.tolist(),
            "dims_90": int((energy < ENERGY).sum()) + 1,
            "effective_rank": float(torch.exp(-torch.xlogy(p, p).sum()))}


@torch.no_grad()
def projection_stats(model) -> dict[str, object]:
    """The module docstring's quantities of `model.recurrence`; ValueError without the two halves."""
    rec = model.recurrence
    if getattr(rec, "injection", None) != "concat":
        raise ValueError(f"the model has no two-half projection W_proj = [W_x | W_h] "
                         f"(injection={getattr(rec, 'injection', None)!r}, needs 'concat')")
    w_x, w_h = rec.proj_h.weight.double(), rec.proj_pre.weight.double()   # (d, d) each
    cos = F.cosine_similarity(w_x, w_h, dim=1)                             # (d,)
    counts = torch.histc(cos, bins=COSINE_BINS, min=-1.0, max=1.0)
    return {"row_cosine": cos.tolist(), "cosine_mean": float(cos.mean()),
            "cosine_aligned": float((cos > ALIGNED).double().mean()),
            "cosine_hist": {"edges": torch.linspace(-1.0, 1.0, COSINE_BINS + 1).tolist(), "counts": counts.tolist()},
            "W_x": spectrum(w_x), "W_h": spectrum(w_h),
            "frobenius": {name: float(getattr(rec, name).weight.double().norm())
                          for name in ("proj_h", "proj_pre", "gate_h", "gate_pre")}}


def run(ctx: Context) -> Result:
    check_model(ctx.model, ctx.r)
    st = projection_stats(ctx.model)
    wx, wh, fro = st["W_x"], st["W_h"], st["frobenius"]
    rows = [{"index": k, "row_cosine": c, "s_x": wx["singular_values"][k], "s_h": wh["singular_values"][k],
             "energy_x": wx["energy"][k], "energy_h": wh["energy"][k]} for k, c in enumerate(st["row_cosine"])]
    d = len(rows)
    summary = ["| quantity | W_x (state) | W_h (anchor) |", "|---|---|---|",
               f"| effective rank (of {d}) | {wx['effective_rank']:.1f} | {wh['effective_rank']:.1f} |",
               f"| dims to {ENERGY:.0%} energy | {wx['dims_90']} | {wh['dims_90']} |",
               f"| leading singular value | {wx['singular_values'][0]:.3g} | {wh['singular_values'][0]:.3g} |",
               f"| Frobenius norm, W_proj | {fro['proj_h']:.3g} | {fro['proj_pre']:.3g} |",
               f"| Frobenius norm, gate layer 1 | {fro['gate_h']:.3g} | {fro['gate_pre']:.3g} |"]
    mean = st["cosine_mean"]
    kind = "near-orthogonal (neither sums nor contrasts state and anchor)" if abs(mean) < ORTHOGONAL else \
        "contrastive (reads the difference of state and anchor)" if mean < 0 else "additive (reads their sum)"
    summary.append(f"Mean row cosine between the halves is {mean:.3f} with {st['cosine_aligned']:.2%} of rows "
                   f"above {ALIGNED}: on average the two halves are {kind}.")
    result = Result(NAME, TITLE, st, rows, summary, [_plot(st, ctx.out / f"{NAME}.png")])
    result.save(ctx.out)
    return result


def _plot(st: dict, path):
    """(a) spectra, (b) cumulative energy, (c) Frobenius norms of the four halves, (d) row cosines."""
    fig = figure((16, 4))
    ax_sv, ax_energy, ax_fro, ax_cos = fig.subplots(1, 4)
    for name in ("W_x", "W_h"):
        ks = range(1, len(st[name]["singular_values"]) + 1)
        ax_sv.plot(ks, st[name]["singular_values"], label=name)
        ax_energy.plot(ks, st[name]["energy"], label=f"{name} ({st[name]['dims_90']} dims to {ENERGY:.0%})")
    ax_energy.axhline(ENERGY, color="grey", linestyle="--")
    for ax, title, ylabel in ((ax_sv, "(a) singular values", "s"), (ax_energy, "(b) cumulative energy", "fraction")):
        ax.set_title(title)
        ax.set_xlabel("index")
        ax.set_ylabel(ylabel)
        ax.legend()
    fro = st["frobenius"]
    ax_fro.bar(list(fro), list(fro.values()), color=["C0", "C1", "C0", "C1"])
    ax_fro.set_title("(c) Frobenius norms (state vs anchor half)")
    edges, counts = st["cosine_hist"]["edges"], st["cosine_hist"]["counts"]
    ax_cos.stairs(counts, edges, fill=True)
    ax_cos.axvline(st["cosine_mean"], color="red", linestyle="--", label=f"mean {st['cosine_mean']:.3f}")
    ax_cos.set_title("(d) row cosine W_x[j] vs W_h[j]")
    ax_cos.set_xlabel("cosine")
    ax_cos.legend()
    return save_figure(fig, path)
