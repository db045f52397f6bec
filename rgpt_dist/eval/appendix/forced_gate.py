"""E.1: the gate forced shut or open, and depths beyond the training depth R.

At the analysed depth r (default R), over all batches:

    loss_gate0   validation loss with g^(i) = 0 at every step: h^(i) = o^(i), every proposal is
                 written and the previous state is discarded (the paper's "Gate=0" / no-skip baseline)
    loss_gate1   validation loss with g^(i) = 1 at every step: h^(i) = h^(i-1) = h_pre, the state is
                 never updated, so it equals the prelude-only exit loss at r = 0 ("Gate=1")
    loss_prelude validation loss at r = 0 (prelude -> coda -> head)
    loss[k]      the trained model's validation loss at depth k, for every k = 0..max(depths)
    depths       the depths reported beside r: round(r * f) for f in (1, 4/3, 5/3, 2), deduplicated
                 (R = 6 gives the paper's 6, 8, 10, 12)

Validation loss = next-token cross-entropy over the real vocabulary, mean over every target != -1
of every batch (batch losses weighted by their target counts; a batch without targets adds nothing).

The gate is forced with a forward hook on `model.recurrence.gate_out` that replaces its output (the
gate logit before 1 / tau) by +inf (sigmoid = 1 exactly) or -inf (sigmoid = 0 exactly); the model's
lerp then returns h or o bit for bit. The hook is removed on exit, also on error.
The trained losses at depths 0..max(depths) come from one forward per batch at the largest depth with
all exits: in eval mode a depth-k forward is the first k steps of a deeper one, read out at step k.
"""
from __future__ import annotations

import contextlib
import math

import torch

from rgpt_dist.eval.appendix.common import Context, Result, check_model, figure, save_figure

NAME = "forced_gate"
TITLE = "E.1: the gate forced to 0 / 1, and depths beyond the training depth"
NEEDS: tuple[str, ...] = ()

DEPTH_FACTORS = (1.0, 4 / 3, 5 / 3, 2.0)


def extended_depths(r: int) -> list[int]:
    """[r, 4r/3, 5r/3, 2r] rounded, deduplicated, ascending."""
    return sorted({round(r * f) for f in DEPTH_FACTORS})


@contextlib.contextmanager
def gate_forced(model, g: int):
    """Every step's gate is exactly g (0 or 1) inside the block: the gate logit becomes -inf or +inf."""
    if g not in (0, 1):
        raise ValueError(f"the gate can be forced to 0 or 1, not {g}")
    value = math.inf if g == 1 else -math.inf
    handle = model.recurrence.gate_out.register_forward_hook(
        lambda module, args, output: torch.full_like(output, value))
    try:
        yield
    finally:
        handle.remove()


def _pooled(losses: list[tuple[torch.Tensor, int]]) -> float:
    """Target-weighted mean of per-batch mean losses [(loss, n_targets)], in float64; a batch without
    targets (loss NaN) adds nothing."""
    return sum(float(loss) * n for loss, n in losses if n) / sum(n for _, n in losses)


@torch.no_grad()
def forced_gate_losses(model, batches, r: int) -> dict:
    """The numbers of the module docstring: {r, depths, loss_prelude, loss_gate0, loss_gate1,
    loss (list over depths 0..max(depths)), n_targets}."""
    depths = extended_depths(r)
    top = depths[-1]
    exits, gate0, gate1 = [], [], []
    for x, y in batches:
        n = int((y != -1).sum())
        exits.append((model(x, y, r=top, all_exits=True).aux["exit_losses"], n))   # (top + 1,)
        with gate_forced(model, 0):
            gate0.append((model(x, y, r=r).loss, n))
        with gate_forced(model, 1):
            gate1.append((model(x, y, r=r).loss, n))
    if not sum(n for _, n in exits):
        raise ValueError("the batches hold no targets != -1")
    loss = [_pooled([(e[k], n) for e, n in exits]) for k in range(top + 1)]
    return {"r": r, "depths": depths, "n_targets": sum(n for _, n in exits), "loss_prelude": loss[0],
            "loss_gate0": _pooled(gate0), "loss_gate1": _pooled(gate1), "loss": loss}


def _rows(d: dict) -> list[dict]:
    """One row per condition: name, depth, loss."""
    r = d["r"]
    rows = [{"condition": "prelude only", "depth": 0, "loss": d["loss_prelude"]},
            {"condition": "gate = 0 (h = o)", "depth": r, "loss": d["loss_gate0"]},
            {"condition": "gate = 1 (h = h_pre)", "depth": r, "loss": d["loss_gate1"]}]
    return rows + [{"condition": "trained", "depth": k, "loss": d["loss"][k]} for k in d["depths"]]


def _summary(d: dict, rows: list[dict]) -> list[str]:
    r, loss = d["r"], d["loss"]
    lines = ["| condition | depth | loss |", "|---|---|---|"]
    lines += [f"| {row['condition']} | {row['depth']} | {row['loss']:.4f} |" for row in rows]
    trained = loss[r]
    below_both = min(d["loss_gate0"], d["loss_gate1"]) > trained
    extra = [loss[k] - trained for k in d["depths"] if k > r]
    beyond = ("" if not extra else
              f" Going beyond r = {r} changes the loss by {', '.join(f'{v:+.4f}' for v in extra)} "
              f"(depths {', '.join(str(k) for k in d['depths'] if k > r)}).")
    lines += ["", f"Gate = 0 gives {d['loss_gate0']:.4f} and gate = 1 gives {d['loss_gate1']:.4f} "
              f"(prelude only: {d['loss_prelude']:.4f}); the trained gate at r = {r} gives {trained:.4f}, "
              f"{'below both forced gates' if below_both else 'not below both forced gates'}." + beyond]
    return lines


def _plot(d: dict, path):
    fig = figure((7, 4.5))
    ax = fig.subplots()
    ks = list(range(len(d["loss"])))
    ax.plot(ks, d["loss"], marker="o", label="trained gate")
    ax.axvline(d["r"], color="grey", linestyle=":", label="analysed depth r")
    ax.axhline(d["loss_gate1"], color="tab:green", linestyle="--", label=f"gate = 1 ({d['loss_gate1']:.3f})")
    ax.axhline(d["loss_gate0"], color="tab:red", linestyle="--", label=f"gate = 0 ({d['loss_gate0']:.3f})")
    ax.set_xticks(ks)
    ax.set_xlabel("recurrence depth")
    ax.set_ylabel("validation loss (nats)")
    ax.set_title(f"trained loss vs depth; gate forced to 0 (h = o) or 1 (h = h_pre) at r = {d['r']}")
    ax.legend()
    return save_figure(fig, path)


def run(ctx: Context) -> Result:
    r = check_model(ctx.model, ctx.r)
    d = forced_gate_losses(ctx.model, ctx.batches, r)
    rows = _rows(d)
    ctx.out.mkdir(parents=True, exist_ok=True)
    figures = [_plot(d, ctx.out / f"{NAME}.png")]
    result = Result(NAME, TITLE, d, rows, _summary(d, rows), figures)
    result.save(ctx.out)
    return result
