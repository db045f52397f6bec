"""E.9: attention entropy, diagonal and previous-token mass of every shared-core head at every step.

The attention uses SDPA, so its probabilities are never materialised; a forward pre-hook on each
core block's attention module (recurrence.blocks[b].attn) recomputes them from its input
u = ln_1(block input) (B, T, d) with the module's own fused qkv layer (per-head [q | k | v] layout,
layers.CausalSelfAttention):

    P = softmax(q k^T / sqrt(head_dim) + causal mask)          (B, H, T, T), P[.., t, s] = 0 for s > t

Per (step i = 1..r, block b, head h), pooled over every query position t of every batch (all
positions count: targets play no role):

    entropy    mean_t  -sum_s P[t, s] log P[t, s]               (nats; at most log T)
    diag_mass  mean_t  P[t, t]
    prev_mass  mean_{t >= 1} P[t, t-1]

Head classes from a head's step-averaged values (each step has the same queries, so this equals the
pooled mean over steps), first match wins: local/sharp (entropy < SHARP), previous-token
(prev_mass > PREV), self (diag_mass > SELF), broadcast (entropy > BROADCAST), general. The paper's
thresholds; its order of precedence is not stated, this order is ours. Per step: mean entropy and
diagonal mass over all heads, and the stability: the fraction of heads whose class at that step
(from that step's values) equals their step-averaged class.
"""
from __future__ import annotations

import contextlib
import math

import torch

from rgpt_dist.eval.appendix.common import Context, Result, check_model, figure, save_figure

NAME = "attention"
TITLE = "E.9: attention entropy, diagonal / previous-token mass and head roles across steps"
NEEDS: tuple[str, ...] = ()
SHARP, PREV, SELF, BROADCAST = 1.0, 0.35, 0.35, 4.0
CLASSES = ("local/sharp", "previous-token", "self", "broadcast", "general")
FIELDS = ("entropy", "diag_mass", "prev_mass")


def probabilities(attn, u: torch.Tensor) -> torch.Tensor:
    """attn: a CausalSelfAttention; u: (B, T, d) its input -> P (B, H, T, T), float32 or wider."""
    B, T, _ = u.shape
    qkv = attn.qkv(u).view(B, T, -1, 3, attn.head_dim)                 # (B, T, H, 3, hd)
    q, k, _ = qkv.permute(3, 0, 2, 1, 4).unbind(0)                     # each (B, H, T, hd)
    scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(attn.head_dim)   # (B, H, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=u.device).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


def head_sums(p: torch.Tensor) -> torch.Tensor:
    """P (B, H, T, T) -> (H, 3) sums over batch and queries of entropy, P[t, t], P[t, t-1] (t >= 1)."""
    entropy = -torch.xlogy(p, p).sum(-1)                               # (B, H, T)
    diag = p.diagonal(dim1=-2, dim2=-1)                                # (B, H, T)
    prev = p.diagonal(offset=-1, dim1=-2, dim2=-1)                     # (B, H, T - 1)
    return torch.stack([entropy.sum((0, 2)), diag.sum((0, 2)), prev.sum((0, 2))], -1).double()


@contextlib.contextmanager
def core_attention(model):
    """Pre-hooks on every core block's attention: yields sums[b], a list that each forward extends by
    one (H, 3) tensor of head_sums per step (the core runs once per step, in step order)."""
    blocks = model.recurrence.blocks
    sums: list[list[torch.Tensor]] = [[] for _ in blocks]

    def hook(b):
        return lambda module, args: sums[b].append(head_sums(probabilities(module, args[0])))

    handles = [block.attn.register_forward_pre_hook(hook(b)) for b, block in enumerate(blocks)]
    try:
        yield sums
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def head_stats(model, batches, r: int) -> torch.Tensor:
    """(r, n_blocks, H, 3) per (step, block, head): mean entropy, diag_mass, prev_mass over all batches."""
    total, n_query, n_prev = None, 0, 0
    for x, _ in batches:
        with core_attention(model) as sums:
            model(x, r=r)
        batch = torch.stack([torch.stack(per_block) for per_block in sums], 1)   # (r, n_blocks, H, 3)
        total = batch if total is None else total + batch
        n_query += x.numel()
        n_prev += x.shape[0] * (x.shape[1] - 1)
    return total / torch.tensor([n_query, n_query, max(n_prev, 1)], dtype=total.dtype, device=total.device)


def classify(entropy: float, diag_mass: float, prev_mass: float) -> str:
    """A head's class from its (step-averaged) values; first match in CLASSES order."""
    if entropy < SHARP:
        return "local/sharp"
    if prev_mass > PREV:
        return "previous-token"
    if diag_mass > SELF:
        return "self"
    if entropy > BROADCAST:
        return "broadcast"
    return "general"


def summarise(stats: torch.Tensor) -> dict[str, object]:
    """stats (r, n_blocks, H, 3) -> per-step means, head classes (step-averaged and per step), stability."""
    per_step = [[[classify(*map(float, head)) for head in block] for block in step] for step in stats]
    averaged = [[classify(*map(float, head)) for head in block] for block in stats.mean(0)]
    flat = [c for block in averaged for c in block]
    stability = [sum(c == a for sb, ab in zip(step, averaged) for c, a in zip(sb, ab)) / len(flat)
                 for step in per_step]
    return {"mean_entropy": stats[..., 0].mean((1, 2)).tolist(), "mean_diag_mass": stats[..., 1].mean((1, 2)).tolist(),
            "mean_prev_mass": stats[..., 2].mean((1, 2)).tolist(), "class": averaged, "class_per_step": per_step,
            "class_counts": {c: flat.count(c) for c in CLASSES}, "stability": stability}


def run(ctx: Context) -> Result:
    r = check_model(ctx.model, ctx.r)
    stats = head_stats(ctx.model, ctx.batches, r).cpu()                # (r, n_blocks, H, 3)
    s = summarise(stats)
    data = {"r": r, "thresholds": {"sharp": SHARP, "prev": PREV, "self": SELF, "broadcast": BROADCAST},
            **{f: stats[..., k].tolist() for k, f in enumerate(FIELDS)}, **s}
    rows = [{"step": i + 1, "block": b, "head": h, **{f: float(stats[i, b, h, k]) for k, f in enumerate(FIELDS)},
             "class": s["class_per_step"][i][b][h], "averaged_class": s["class"][b][h]}
            for i in range(r) for b in range(stats.shape[1]) for h in range(stats.shape[2])]
    summary = ["| step | mean entropy (nats) | mean diagonal mass | mean prev-token mass | heads in averaged class |",
               "|---|---|---|---|---|"]
    summary += [f"| {i} | {e:.3f} | {dm:.3f} | {pm:.3f} | {st:.0%} |" for i, (e, dm, pm, st) in
                enumerate(zip(s["mean_entropy"], s["mean_diag_mass"], s["mean_prev_mass"], s["stability"]), start=1)]
    counts = ", ".join(f"{n} {c}" for c, n in s["class_counts"].items())
    low = min(range(r), key=lambda i: s["mean_entropy"][i]) + 1
    summary.append(f"Of {len(rows) // r} heads: {counts}. Mean entropy is lowest at step {low} "
                   f"({s['mean_entropy'][low - 1]:.3f} nats); on average {sum(s['stability']) / r:.0%} of heads "
                   f"keep their averaged class at a step.")
    result = Result(NAME, TITLE, data, rows, summary, [_plot(stats, s, ctx.out / f"{NAME}.png")])
    result.save(ctx.out)
    return result


def _plot(stats: torch.Tensor, s: dict, path):
    """(a) entropy heatmap, steps x (block, head); (b) mean entropy and diagonal mass per step; (c) class counts."""
    r, n_blocks, n_head = stats.shape[:3]
    fig = figure((14, 4))
    ax_map, ax_steps, ax_cls = fig.subplots(1, 3, gridspec_kw={"width_ratios": [2, 1, 1]})
    im = ax_map.imshow(stats[..., 0].reshape(r, -1).numpy(), aspect="auto", cmap="viridis")
    for b in range(1, n_blocks):
        ax_map.axvline(b * n_head - 0.5, color="white")
    ax_map.set_yticks(range(r), [str(i) for i in range(1, r + 1)])
    ax_map.set_ylabel("recurrence step")
    ax_map.set_xlabel("block x head")
    ax_map.set_title("(a) attention entropy (nats)")
    fig.colorbar(im, ax=ax_map)
    steps = range(1, r + 1)
    ax_steps.plot(steps, s["mean_entropy"], marker="o", color="C0")
    ax_steps.set_ylabel("mean entropy (nats)", color="C0")
    ax_mass = ax_steps.twinx()
    ax_mass.plot(steps, s["mean_diag_mass"], marker="s", color="C1")
    ax_mass.set_ylabel("mean diagonal mass", color="C1")
    ax_steps.set_xticks(list(steps))
    ax_steps.set_xlabel("recurrence step")
    ax_steps.set_title("(b) per-step means")
    ax_cls.bar(range(len(CLASSES)), [s["class_counts"][c] for c in CLASSES])
    ax_cls.set_xticks(range(len(CLASSES)), CLASSES, rotation=30, fontsize=8)
    ax_cls.set_title("(c) head classes (step-averaged)")
    return save_figure(fig, path)
