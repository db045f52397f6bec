"""Fig. 4: how the next-token prediction for one prompt evolves over the recurrence steps.

For the prompt x (T,) (ctx.prompt, default the first row of the first batch) and every step
i = 0..r (0 = prelude only), the exit distribution at the prompt's last position

    p_i = softmax(head(coda(h^(i)))[T - 1, :vocab_size])        (V,), float32, real vocabulary only

(common.exit_logits; for i = r these are the model's own logits, and for any i they equal those of a
forward at depth i, model(x, r=i)). Reported per step: the top-K tokens with their probabilities,
the probability of the final step's top-1 token (and of each final top-K token: the figure's lines)
and the entropy -sum_v p_i(v) log p_i(v) in nats. Only the last position is analysed (the paper
shows one next token per prompt). Labels are ctx.decode([id]) when given, else the ids.
"""
from __future__ import annotations

import torch

from rgpt_dist.eval.appendix.common import Context, Result, check_model, exit_logits, figure, label, save_figure, trace
from rgpt_dist.markdown import cell

NAME = "top_tokens"
TITLE = "Fig. 4: per-step top-token probabilities for a prompt"
NEEDS: tuple[str, ...] = ()
K = 5


@torch.no_grad()
def step_distributions(model, prompt: torch.Tensor, r: int) -> torch.Tensor:
    """prompt (T,) -> (r + 1, V) exit probabilities at its last position, step 0..r."""
    h = trace(model, prompt[None], r).h                                # r + 1 x (1, T, d)
    return torch.stack([exit_logits(model, hi)[0, -1].float().softmax(-1) for hi in h])


def top_tokens(probs: torch.Tensor, k: int = K) -> dict[str, object]:
    """probs (r + 1, V) -> per step top-k ids and probabilities, the final top-k ids and their
    probability at every step, and the entropy per step."""
    top_p, top_id = probs.topk(k, dim=-1)                              # (r + 1, k) each
    final = top_id[-1]                                                 # (k,)
    return {"top_ids": top_id.tolist(), "top_probs": top_p.tolist(), "final_top_ids": final.tolist(),
            "final_top_probs": probs[:, final].T.tolist(),             # (k, r + 1): one line per token
            "p_final_top1": probs[:, final[0]].tolist(),
            "entropy": (-torch.xlogy(probs, probs).sum(-1)).tolist()}


def run(ctx: Context) -> Result:
    r = check_model(ctx.model, ctx.r)
    prompt = ctx.prompt if ctx.prompt is not None else ctx.batches[0][0][0]
    t = top_tokens(step_distributions(ctx.model, prompt, r))
    name = (lambda i: label(ctx.decode([i]))) if ctx.decode is not None else str
    data = {"r": r, "prompt": prompt.tolist(), "k": K, **t,
            "top_tokens": [[name(i) for i in ids] for ids in t["top_ids"]]}
    rows = [{"step": i, "rank": j + 1, "token_id": tid, "token": name(tid), "prob": p}
            for i, (ids, ps) in enumerate(zip(t["top_ids"], t["top_probs"])) for j, (tid, p) in enumerate(zip(ids, ps))]
    final = cell(name(t["final_top_ids"][0]))  # decoded tokens may hold '|' or line breaks: escaped
    summary = [f"| step | top-1 | p(top-1) | p({final}) | entropy (nats) |", "|---|---|---|---|---|"]
    summary += [f"| {i} | {cell(name(ids[0]))} | {ps[0]:.3f} | {pf:.3f} | {e:.3f} |" for i, (ids, ps, pf, e) in
                enumerate(zip(t["top_ids"], t["top_probs"], t["p_final_top1"], t["entropy"]))]
    settled = next(i for i in range(r + 1) if all(ids[0] == t["final_top_ids"][0] for ids in t["top_ids"][i:]))
    summary.append(f"The final prediction {final} is the top-1 token from step {settled} on; its probability goes "
                   f"from {t['p_final_top1'][0]:.3f} at step 0 to {t['p_final_top1'][-1]:.3f} at step {r}.")
    result = Result(NAME, TITLE, data, rows, summary, [_plot(t, name, ctx.out / f"{NAME}.png")])
    result.save(ctx.out)
    return result


def _plot(t: dict, name, path):
    """The probability of each of the final step's top-K tokens vs step."""
    steps = range(len(t["entropy"]))
    fig = figure((7, 4))
    ax = fig.subplots()
    for tid, probs in zip(t["final_top_ids"], t["final_top_probs"]):
        ax.plot(steps, probs, marker="o", label=name(tid))
    ax.set_xticks(list(steps))
    ax.set_xlabel("recurrence step (0 = prelude)")
    ax.set_ylabel("next-token probability")
    ax.set_title("final top tokens' probability per step")
    ax.legend(title="token")
    return save_figure(fig, path)
