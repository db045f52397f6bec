"""E.10: loss per recurrence step by token-frequency band of the target token id.

BPE ids are roughly in merge order, so the id is a proxy for frequency. BANDS (inclusive id ranges, None
= no upper end) are the paper's: byte/punctuation 0-255, common 256-2000, medium 2001-10000, rare
> 10000. A band is the set of targets != -1 of all batches whose id falls in it; per band:

    n                   number of its targets
    loss[i]             mean exit loss of coda + head at h^(i) over its targets, i = 0..r
    rel_improvement[i]  (loss[i-1] - loss[i]) / loss[i-1], i = 1..r: the share of the previous step's
                        loss resolved by step i (the paper's Delta_r^rel)
    recovery            (loss[0] - loss[r]) / loss[0]: the share of the initial loss recovered
    improvement         loss[0] - loss[r]

Losses are totals accumulated in float64 over all batches divided by n. An empty band (n = 0: the
vocabulary or the data has no such ids) has None in place of every value; so has step 0 of
rel_improvement.
"""
from __future__ import annotations

import torch

from rgpt_dist.eval.appendix.common import Context, Result, check_model, exit_losses, figure, fmt, save_figure, trace

NAME = "frequency"
TITLE = "E.10: loss by token-frequency band"
NEEDS: tuple[str, ...] = ()

BANDS: tuple[tuple[str, int, int | None], ...] = (
    ("byte/punctuation", 0, 255), ("common", 256, 2000), ("medium", 2001, 10000), ("rare", 10001, None))


def band_mask(y: torch.Tensor, lo: int, hi: int | None) -> torch.Tensor:
    """(B, T) bool: targets != -1 with lo <= id <= hi (no upper end when hi is None)."""
    mask = (y != -1) & (y >= lo)
    return mask if hi is None else mask & (y <= hi)


def _band(name: str, lo: int, hi: int | None, n: int, sums: torch.Tensor) -> dict:
    """One band's entry from its target count and (r + 1,) float64 summed losses per step."""
    r = sums.shape[0] - 1
    entry = {"band": name, "ids": f"{lo}-{hi}" if hi is not None else f">={lo}", "n": n}
    if n == 0:
        return {**entry, "loss": [None] * (r + 1), "rel_improvement": [None] * (r + 1),
                "improvement": None, "recovery": None}
    loss = (sums / n).tolist()
    rel = [None] + [(loss[i - 1] - loss[i]) / loss[i - 1] if loss[i - 1] > 0 else None for i in range(1, r + 1)]
    return {**entry, "loss": loss, "rel_improvement": rel, "improvement": loss[0] - loss[r],
            "recovery": (loss[0] - loss[r]) / loss[0] if loss[0] > 0 else None}


@torch.no_grad()
def band_stats(model, batches, r: int, bands=BANDS) -> dict:
    """The numbers of the module docstring over all `batches` [(x, y), each (B, T)]."""
    sums = torch.zeros(len(bands), r + 1, dtype=torch.float64)
    counts = [0] * len(bands)
    for x, y in batches:
        h = trace(model, x, r).h
        losses = torch.stack([exit_losses(model, s, y) for s in h]).double()          # (r + 1, B, T)
        for b, (_, lo, hi) in enumerate(bands):
            mask = band_mask(y, lo, hi)
            sums[b] += losses[:, mask].sum(-1).cpu()
            counts[b] += int(mask.sum())
    if not sum(counts):
        raise ValueError("the batches hold no targets != -1")
    return {"r": r, "n_targets": sum(counts),
            "bands": [_band(name, lo, hi, counts[b], sums[b]) for b, (name, lo, hi) in enumerate(bands)]}


def _rows(d: dict) -> list[dict]:
    """One row per band: n, loss_0..loss_r, rel_1..rel_r, improvement, recovery."""
    r = d["r"]
    return [{"band": b["band"], "ids": b["ids"], "n": b["n"], **{f"loss_{i}": b["loss"][i] for i in range(r + 1)},
             **{f"rel_{i}": b["rel_improvement"][i] for i in range(1, r + 1)},
             "improvement": b["improvement"], "recovery": b["recovery"]} for b in d["bands"]]


def _summary(d: dict) -> list[str]:
    r, full = d["r"], [b for b in d["bands"] if b["n"]]
    lines = [f"| band | ids | n | L0 | L{r} | rel. improvement step 1 | recovery (L0 - L{r}) / L0 |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {b['band']} | {b['ids']} | {b['n']} | {fmt(b['loss'][0])} | {fmt(b['loss'][r])} | "
              f"{fmt(b['rel_improvement'][1])} | {fmt(b['recovery'])} |" for b in d["bands"]]
    ranked = sorted((b for b in full if b["recovery"] is not None), key=lambda b: b["recovery"])
    first = [b for b in full if b["rel_improvement"][1] is not None]
    text = f"{len(full)} of {len(d['bands'])} bands hold targets."
    if ranked:
        text += (f" Recovery over {r} steps is highest for {ranked[-1]['band']} ({ranked[-1]['recovery']:.2%}) "
                 f"and lowest for {ranked[0]['band']} ({ranked[0]['recovery']:.2%}).")
    if first:
        top = max(first, key=lambda b: b["rel_improvement"][1])
        text += f" Step 1 resolves the largest share of the loss for {top['band']} ({top['rel_improvement'][1]:.2%})."
    return lines + ["", text]


def _plot(d: dict, path):
    r, full = d["r"], [b for b in d["bands"] if b["n"]]
    fig = figure((14, 4.2))
    ax_loss, ax_rel, ax_scatter = fig.subplots(1, 3)
    for b in full:
        label = f"{b['band']} ({b['ids']}, n={b['n']})"
        ax_loss.plot(range(r + 1), b["loss"], marker="o", label=label)
        ax_rel.plot(range(1, r + 1), b["rel_improvement"][1:], marker="o", label=label)
        ax_scatter.scatter(b["loss"][0], b["improvement"])
        ax_scatter.annotate(b["band"], (b["loss"][0], b["improvement"]), fontsize=8)
    ax_loss.set(title="(a) loss per step by band", xlabel="recurrence step", ylabel="loss", xticks=range(r + 1))
    ax_rel.set(title="(b) (L(i-1) - L(i)) / L(i-1)", xlabel="recurrence step", xticks=range(1, r + 1))
    ax_scatter.set(title="(c) initial loss vs total improvement", xlabel="L0", ylabel=f"L0 - L{r}")
    ax_loss.legend(fontsize=7)
    ax_rel.legend(fontsize=7)
    return save_figure(fig, path)


def run(ctx: Context) -> Result:
    r = check_model(ctx.model, ctx.r)
    d = band_stats(ctx.model, ctx.batches, r)
    ctx.out.mkdir(parents=True, exist_ok=True)
    figures = [_plot(d, ctx.out / f"{NAME}.png")]
    result = Result(NAME, TITLE, d, _rows(d), _summary(d), figures)
    result.save(ctx.out)
    return result
