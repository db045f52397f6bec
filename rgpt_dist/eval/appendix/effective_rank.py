"""E.6: effective rank of the state and of the late-step updates, beside the fixed-point delta.

    erank(X)       Roy & Vetterli (2007): exp(-sum_k p_k log p_k), p_k = s_k / sum_j s_j, s the singular
                   values of X (0 log 0 = 0); 1 for a rank-1 matrix, m for m equal singular values
    state_rank[i]  erank(H^(i)) / min(N, d), i = 0..r, H^(i) (N, d) the states h^(i) of all N = B x T
                   positions of all batches stacked (targets -1 included), NOT centred: the paper gives
                   no centring, so a mean direction shared by all tokens counts as one direction
    delta_rank     erank(D) / min(N k, d), D (N k, d) the stacked late updates h^(i) - h^(i-1) of the
                   k steps i > r / 2 (r = 6: steps 4, 5, 6; r = 3: steps 2, 3), likewise not centred
    fixed_point_delta[i]  ||h^(i) - h^(i-1)||_F / ||h^(i-1)||_F over all tokens (Eq. 7, as in
                   rgpt_dist.eval.appendix.diagnostics), i = 1..r
    delta_cos[i]   mean over the N tokens of cos(h^(i) - h^(i-1), h^(i-1) - h^(i-2)), i = 2..r

Memory: the tokens are never held together. Per matrix the (d, d) Gram X^T X is accumulated in float64
batch by batch; its eigenvalues are the squared singular values of X, so s = sqrt(eigvalsh(X^T X)),
eigenvalues below d * eps_float64 * lambda_max (numerical zeros of the Gram, as in matrix_rank's
tolerance) set to 0. Undefined entries (step 0; delta_cos at step 1) are None.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rgpt_dist.eval.appendix.common import Context, Result, check_model, figure, fmt, save_figure, trace

NAME = "effective_rank"
TITLE = "E.6: effective rank of the state and of the late-step updates, fixed-point delta"
NEEDS: tuple[str, ...] = ()


def singular_values_from_gram(gram: torch.Tensor) -> torch.Tensor:
    """(d, d) Gram X^T X (float64) -> (d,) singular values of X, descending; all NaN when the Gram
    is not finite (eigvalsh would raise LinAlgError on NaN / inf states)."""
    if not bool(torch.isfinite(gram).all()):
        return torch.full(gram.shape[:1], float("nan"), dtype=torch.float64, device=gram.device)
    eig = torch.linalg.eigvalsh(gram.double()).flip(0)                       # descending, (d,)
    tol = gram.shape[0] * torch.finfo(torch.float64).eps * eig[0].clamp(min=0)
    return torch.where(eig > tol, eig, torch.zeros_like(eig)).sqrt()


def effective_rank(s: torch.Tensor) -> float:
    """Roy & Vetterli effective rank of singular values s (k,): exp of the entropy of s / sum(s);
    NaN when s is not finite (undefined, not 0)."""
    if not bool(torch.isfinite(s).all()):
        return float("nan")
    if not s.sum() > 0:
        return 0.0                                                   # a zero matrix has no directions
    p = s.double() / s.double().sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def late_steps(r: int) -> list[int]:
    """The steps i with i > r / 2, whose updates make up the delta subspace."""
    return [i for i in range(1, r + 1) if 2 * i > r]


@torch.no_grad()
def rank_stats(model, batches, r: int) -> dict:
    """The numbers of the module docstring over all `batches` [(x, y), each (B, T)]."""
    late = late_steps(r)
    state_gram, delta_gram = [0.0] * (r + 1), 0.0                              # (d, d) float64 each
    upd_sq, prev_sq, cos_sum = ([0.0] * (r + 1) for _ in range(3))           # float64 totals per step
    n = 0
    for x, _ in batches:
        h = [s.double().flatten(0, 1) for s in trace(model, x, r).h]             # r + 1 x (B T, d)
        deltas = [None] + [h[i] - h[i - 1] for i in range(1, r + 1)]
        n += h[0].shape[0]
        for i in range(r + 1):
            state_gram[i] = state_gram[i] + h[i].T @ h[i]
        for i in range(1, r + 1):
            upd_sq[i] += float(deltas[i].square().sum())
            prev_sq[i] += float(h[i - 1].square().sum())
            if i >= 2:
                cos_sum[i] += float(F.cosine_similarity(deltas[i], deltas[i - 1], dim=-1).sum())
            if i in late:
                delta_gram = delta_gram + deltas[i].T @ deltas[i]
    if n == 0:
        raise ValueError("no batches given")
    width = h[0].shape[1]
    state_erank = [effective_rank(singular_values_from_gram(g)) for g in state_gram]
    delta_erank = effective_rank(singular_values_from_gram(delta_gram))
    return {"r": r, "n_tokens": n, "d": width, "late_steps": late, "state_erank": state_erank,
            "state_rank": [e / min(n, width) for e in state_erank],
            "delta_erank": delta_erank, "delta_rank": delta_erank / min(n * len(late), width),
            "fixed_point_delta": [None] + [math.sqrt(u / p) for u, p in zip(upd_sq[1:], prev_sq[1:])],
            "delta_cos": [None, None] + [c / n for c in cos_sum[2:]]}


def _summary(d: dict, rows: list[dict]) -> list[str]:
    r, rank = d["r"], d["state_rank"]
    lines = ["| step | state erank / min(N, d) | fixed-point delta | cos(dh, dh_prev) |", "|---|---|---|---|"]
    lines += [f"| {row['step']} | {fmt(row['state_rank'])} | {fmt(row['fixed_point_delta'])} | "
              f"{fmt(row['delta_cos'])} |" for row in rows]
    peak = max(range(r + 1), key=lambda i: rank[i])
    cmp = "above" if d["delta_rank"] > max(rank) else "not above"
    lines += ["", f"The normalised effective rank of the state goes from {rank[0]:.4g} (step 0) to "
              f"{rank[r]:.4g} (step {r}), highest at step {peak}; the late-update subspace (steps "
              f"{', '.join(map(str, d['late_steps']))}) has {d['delta_rank']:.4g}, {cmp} every step's state; "
              f"the fixed-point delta goes from {d['fixed_point_delta'][1]:.4g} to {d['fixed_point_delta'][r]:.4g}."]
    return lines


def _plot(d: dict, path):
    r = d["r"]
    fig = figure((11, 4.2))
    ax_rank, ax_fp = fig.subplots(1, 2)
    ax_rank.plot(range(r + 1), d["state_rank"], marker="o", label="state h^(i)")
    ax_rank.axhline(d["delta_rank"], color="tab:orange", linestyle="--",
                    label=f"late updates, steps {d['late_steps'][0]}..{r}")
    ax_rank.set(title="(a) effective rank / min(N, d)", xlabel="recurrence step", xticks=range(r + 1))
    ax_rank.legend()
    ax_fp.plot(range(1, r + 1), d["fixed_point_delta"][1:], marker="o", color="tab:orange", label="fixed-point delta")
    if r >= 2:
        ax_fp.plot(range(2, r + 1), d["delta_cos"][2:], marker="o", color="tab:blue", label="cos(dh, dh_prev)")
    ax_fp.set(title="(b) fixed-point delta and update cosine", xlabel="recurrence step", xticks=range(1, r + 1))
    ax_fp.legend()
    return save_figure(fig, path)


def run(ctx: Context) -> Result:
    r = check_model(ctx.model, ctx.r)
    d = rank_stats(ctx.model, ctx.batches, r)
    rows = [{"step": i, "state_erank": d["state_erank"][i], "state_rank": d["state_rank"][i],
             "fixed_point_delta": d["fixed_point_delta"][i], "delta_cos": d["delta_cos"][i]} for i in range(r + 1)]
    ctx.out.mkdir(parents=True, exist_ok=True)
    figures = [_plot(d, ctx.out / f"{NAME}.png")]
    result = Result(NAME, TITLE, d, rows, _summary(d, rows), figures)
    result.save(ctx.out)
    return result
