"""E.1, E.2, E.4 (within the model) and E.6 (fixed-point delta): the per-step exit loss and KL to the
final step, gate statistics, applied-update / proposal ratio (Eq. 6), fixed-point delta (Eq. 7) and
the CKA between steps, from rgpt_dist.eval.appendix.diagnostics (definitions there), plus the per-token gate
heatmap of the prompt."""
from __future__ import annotations

import dataclasses

from rgpt_dist.eval.appendix.common import Context, Result, check_model, fmt
from rgpt_dist.eval.appendix.diagnostics import STEP_FIELDS, diagnose, gate_heatmap

NAME = "diagnostics"
TITLE = "E.1, E.2, E.4, E.6: per-step loss, KL, gates, update ratio, fixed-point delta, CKA between steps"
NEEDS: tuple[str, ...] = ()


def run(ctx: Context) -> Result:
    r = check_model(ctx.model, ctx.r)
    d = diagnose(ctx.model, ctx.batches, r=r)
    figures = d.plot(ctx.out)
    prompt = ctx.prompt if ctx.prompt is not None else ctx.batches[0][0][0, :64]
    gate_heatmap(ctx.model, prompt, ctx.out / "gate_heatmap.png", decode=ctx.decode, r=r)
    figures.append(ctx.out / "gate_heatmap.png")
    rows = [{"step": i, **{k: getattr(d, k)[i] for k in STEP_FIELDS}} for i in range(r + 1)]
    summary = ["| step | " + " | ".join(STEP_FIELDS) + " |", "|---" * (len(STEP_FIELDS) + 1) + "|"]
    summary += ["| " + " | ".join([str(row["step"])] + [fmt(row[k]) for k in STEP_FIELDS]) + " |" for row in rows]
    result = Result(NAME, TITLE, dataclasses.asdict(d), rows, summary, figures)
    result.save(ctx.out)
    return result
