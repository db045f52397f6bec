"""E.5: loss and gate by token difficulty, difficulty = the token's loss at step 0 (prelude exit).

Tokens are the targets != -1 of all batches, pooled (n in all). With L_t^(i) the token's exit loss at
state h^(i) (coda + head, real vocabulary) and gbar_t^(i) = mean over the d channels of g^(i) at the
token's position:

    deciles        tokens sorted by L^(0) ascending (stable sort: ties keep batch order); the token of
                   rank k = 0..n-1 goes to decile floor(10 k / n), so sizes differ by at most one and a
                   decile is empty only when n < 10 (its entries are then n = 0 and None)
    per decile j   n; initial_loss = mean L^(0); loss[i] = mean L^(i), i = 0..r;
                   improvement = mean (L^(0) - L^(r)); gate[i] = mean gbar^(i), i = 1..r (None at 0)
    r2             R^2 of the least-squares line improvement ~ initial_loss over the non-empty deciles
                   (with its slope and intercept; None with fewer than two distinct x)
    gate_corr[i]   Pearson correlation over all n tokens of gbar^(i) and L^(0), i = 1..r (None at 0):
                   negative = harder tokens get a more open (lower, write-heavy) gate

Per-token values are kept (n x (2r + 1) float64 on the CPU: 56 bytes a token at r = 3) so that
deciles are exact; decile statistics are float64 means.
"""
from __future__ import annotations

import torch

from rgpt_dist.eval.appendix.common import Context, Result, check_model, exit_losses, figure, fmt, save_figure, trace
from matplotlib import colormaps

NAME = "difficulty"
TITLE = "E.5: loss and gate by token-difficulty decile"
NEEDS: tuple[str, ...] = ()

N_DECILES = 10


@torch.no_grad()
def token_values(model, batches, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per target != -1 of all batches: losses (n, r + 1) L^(0..r) and gates (n, r) gbar^(1..r), float64."""
    losses, gates = [], []
    for x, y in batches:
        tr = trace(model, x, r)
        keep = y != -1                                                            # (B, T)
        losses.append(torch.stack([exit_losses(model, h, y)[keep] for h in tr.h], -1).double().cpu())
        gates.append(torch.stack([g.double().mean(-1)[keep] for g in tr.g[1:]], -1).cpu())
    return torch.cat(losses), torch.cat(gates)


def decile_index(initial: torch.Tensor) -> torch.Tensor:
    """(n,) step-0 losses -> (n,) decile 0..9 of each token: floor(10 rank / n), rank by stable sort."""
    n = initial.shape[0]
    order = torch.sort(initial, stable=True).indices
    index = torch.empty(n, dtype=torch.long)
    index[order] = torch.arange(n) * N_DECILES // n
    return index


def _line_fit(x: list[float], y: list[float]) -> dict:
    """Least squares y = a x + b: {slope, intercept, r2}, None where undefined."""
    undefined = {"slope": None, "intercept": None, "r2": None}
    if len(x) < 2:
        return undefined
    xs, ys = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    sxx = (xs - xs.mean()).square().sum()
    if sxx <= 0:
        return undefined
    slope = float(((xs - xs.mean()) * (ys - ys.mean())).sum() / sxx)
    intercept = float(ys.mean() - slope * xs.mean())
    ss_tot = float((ys - ys.mean()).square().sum())
    ss_res = float((ys - slope * xs - intercept).square().sum())
    return {"slope": slope, "intercept": intercept, "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else None}


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float | None:
    a, b = a - a.mean(), b - b.mean()
    den = float(a.norm() * b.norm())
    return float((a * b).sum()) / den if den > 0 else None


def difficulty_stats(losses: torch.Tensor, gates: torch.Tensor) -> dict:
    """losses (n, r + 1), gates (n, r) from `token_values` -> the numbers of the module docstring."""
    n, r = losses.shape[0], losses.shape[1] - 1
    if n == 0:
        raise ValueError("the batches hold no targets != -1")
    index = decile_index(losses[:, 0])
    deciles = []
    for j in range(N_DECILES):
        sel = index == j
        if not sel.any():
            deciles.append({"decile": j, "n": 0, "initial_loss": None, "improvement": None,
                            "loss": [None] * (r + 1), "gate": [None] * (r + 1)})
            continue
        mean_loss = losses[sel].mean(0).tolist()                                  # (r + 1,)
        deciles.append({"decile": j, "n": int(sel.sum()), "initial_loss": mean_loss[0],
                        "improvement": float((losses[sel, 0] - losses[sel, r]).mean()),
                        "loss": mean_loss, "gate": [None] + gates[sel].mean(0).tolist()})
    full = [dec for dec in deciles if dec["n"]]
    fit = _line_fit([dec["initial_loss"] for dec in full], [dec["improvement"] for dec in full])
    corr = [None] + [_pearson(gates[:, i - 1], losses[:, 0]) for i in range(1, r + 1)]
    return {"r": r, "n_targets": n, "deciles": deciles, **fit, "gate_corr": corr}


def _rows(d: dict) -> list[dict]:
    """One row per decile: n, initial loss, improvement, loss_0..loss_r, gate_1..gate_r."""
    r = d["r"]
    return [{"decile": dec["decile"], "n": dec["n"], "initial_loss": dec["initial_loss"],
             "improvement": dec["improvement"], **{f"loss_{i}": dec["loss"][i] for i in range(r + 1)},
             **{f"gate_{i}": dec["gate"][i] for i in range(1, r + 1)}} for dec in d["deciles"]]


def _summary(d: dict) -> list[str]:
    r, full = d["r"], [dec for dec in d["deciles"] if dec["n"]]
    lines = [f"| decile | n | L0 | L{r} | improvement | mean gate step {r} |", "|---|---|---|---|---|---|"]
    lines += [f"| {dec['decile']} | {dec['n']} | {fmt(dec['initial_loss'])} | {fmt(dec['loss'][r])} | "
              f"{fmt(dec['improvement'])} | {fmt(dec['gate'][r])} |" for dec in d["deciles"]]
    corr = [c for c in d["gate_corr"] if c is not None]
    corr_text = f"{min(corr):+.3f} to {max(corr):+.3f}" if corr else "undefined"
    lines += ["", f"The easiest decile improves by {full[0]['improvement']:.4g} nats and the hardest by "
              f"{full[-1]['improvement']:.4g} over {r} steps; the line improvement ~ initial loss has slope "
              f"{fmt(d['slope'])} and R^2 = {fmt(d['r2'])}; the per-token gate-difficulty correlation over "
              f"steps 1..{r} is {corr_text}."]
    return lines


def _plot(d: dict, path):
    r, full = d["r"], [dec for dec in d["deciles"] if dec["n"]]
    fig = figure((14, 4.2))
    ax_fit, ax_steps, ax_corr = fig.subplots(1, 3)
    xs, ys = [dec["initial_loss"] for dec in full], [dec["improvement"] for dec in full]
    ax_fit.scatter(xs, ys)
    if d["slope"] is not None:
        ax_fit.plot(xs, [d["slope"] * v + d["intercept"] for v in xs], linestyle="--", color="grey")
    ax_fit.set(title=f"(a) improvement vs initial loss (R^2 = {fmt(d['r2'])})",
               xlabel="mean step-0 loss of the decile", ylabel=f"mean L0 - L{r}")
    for dec in full:
        color = colormaps["viridis"](dec["decile"] / (N_DECILES - 1))
        ax_steps.plot(range(r + 1), dec["loss"], marker="o", color=color, label=f"decile {dec['decile']}")
    ax_steps.set(title="(b) per-step loss by decile", xlabel="recurrence step", ylabel="mean loss", xticks=range(r + 1))
    ax_steps.legend(fontsize=7)
    ax_corr.plot(range(1, r + 1), d["gate_corr"][1:], marker="o")
    ax_corr.axhline(0.0, color="grey", linewidth=0.8)
    ax_corr.set(title="(c) corr(per-token mean gate, step-0 loss)", xlabel="recurrence step", xticks=range(1, r + 1))
    return save_figure(fig, path)


def run(ctx: Context) -> Result:
    r = check_model(ctx.model, ctx.r)
    d = difficulty_stats(*token_values(ctx.model, ctx.batches, r))
    ctx.out.mkdir(parents=True, exist_ok=True)
    figures = [_plot(d, ctx.out / f"{NAME}.png")]
    result = Result(NAME, TITLE, d, _rows(d), _summary(d), figures)
    result.save(ctx.out)
    return result
