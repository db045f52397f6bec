"""Appendix E diagnostics of a RecurrentGPT: what each recurrence step does (SPEC section 5).

For steps i = 0..r (step 0 = the prelude output h^(0), no recurrence yet), over a list of (x, y) batches:

    loss[i]         next-token loss of the exit at step i: head(coda(h^(i))), mean over targets != -1
    kl_to_final[i]  KL(p_r || p_i) = sum_v p_r(v) (log p_r(v) - log p_i(v)), mean over tokens: how far the
                    step-i exit is from the final step's distribution (0 at i = r); softmax over the real
                    vocabulary (logits[..., :vocab_size]), padded head rows excluded
    gate_*[i]       gate mean, std, fraction > 0.95 (copy), fraction < 0.05 (write), pooled over every
                    gate scalar of every batch (from the model's aux; None at step 0)
    update_ratio[i] ||h^(i) - h^(i-1)|| / ||o^(i) - h^(i-1)||   applied update / proposal (paper Eq. 6)
    fixed_point_delta[i]  ||h^(i) - h^(i-1)|| / ||h^(i-1)||     (paper Eq. 7)
    cka[i][j]       linear CKA between h^(i) and h^(j), tokens as samples (Kornblith et al. 2019)

Norms: Frobenius over all tokens of all batches, i.e. sqrt of the sum of squares accumulated batch by
batch (one ratio of totals, not a mean of per-token ratios); this is the paper's Eq. 7 norm.
o^(i) is the shared core's output (the proposal) and h^(i) = g * h^(i-1) + (1 - g) * o^(i).

Internals are read with forward hooks on `model.recurrence` (input h^(i-1), output (h^(i), g)) and on
`model.recurrence.blocks[-1]` (output o^(i)); exits go through the model's own coda and head
(`model.readout`). Hooks are removed afterwards, also on error. No torch.distributed.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from rgpt_dist import strict_json
from rgpt_dist.eval.finite import nonfinite_weights
from matplotlib.figure import Figure

GATE_KEYS = ("gate_mean", "gate_std", "gate_hi", "gate_lo")
STEP_FIELDS = ("loss", "kl_to_final") + GATE_KEYS + ("update_ratio", "fixed_point_delta")


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of x (n, d1) and y (n, d2), rows = samples, features centered:
    ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)."""
    x = x.double() - x.double().mean(0)
    y = y.double() - y.double().mean(0)
    return float((y.T @ x).square().sum() / ((x.T @ x).norm() * (y.T @ y).norm()))


class CKAStats:
    """Linear CKA between every pair of k representations from sufficient statistics accumulated
    batch by batch: per representation the feature sum (d,) and per pair the cross-product X_i^T X_j
    (d, d), in float64. Exact over all tokens; memory k (k + 1) / 2 d^2 doubles (d = 1280, k = 7:
    370 MB), independent of the number of tokens."""

    def __init__(self, k: int):
        self.k, self.n = k, 0
        self.sums: list[torch.Tensor | None] = [None] * k
        self.cross: dict[tuple[int, int], torch.Tensor] = {}

    def update(self, states: list[torch.Tensor]) -> None:
        """states: k tensors (..., d) with the same leading (token) shape."""
        xs = [s.reshape(-1, s.shape[-1]).double() for s in states]  # k x (n, d)
        self.n += xs[0].shape[0]
        for i, xi in enumerate(xs):
            self.sums[i] = xi.sum(0) if self.sums[i] is None else self.sums[i] + xi.sum(0)
            for j in range(i, self.k):
                c = xi.T @ xs[j]                                     # (d, d)
                self.cross[i, j] = c if (i, j) not in self.cross else self.cross[i, j] + c

    def _centered(self, i: int, j: int) -> torch.Tensor:
        """Xc_i^T Xc_j = X_i^T X_j - n mu_i mu_j^T."""
        return self.cross[i, j] - torch.outer(self.sums[i], self.sums[j]) / self.n

    def matrix(self) -> list[list[float]]:
        """(k, k) CKA matrix, symmetric, 1 on the diagonal."""
        self_norm = [self._centered(i, i).norm() for i in range(self.k)]
        out = [[1.0] * self.k for _ in range(self.k)]
        for i in range(self.k):
            for j in range(i + 1, self.k):
                v = float(self._centered(i, j).square().sum() / (self_norm[i] * self_norm[j]))
                out[i][j] = out[j][i] = v
        return out


@contextlib.contextmanager
def capture(model):
    """Hooks recording one forward's recurrence: yields a dict with `h` ([h^(0), h^(1), ...], each
    (B, T, d)), `o` ([o^(1), ...]) and `g` ([g^(1), ...]); the hooks are removed on exit."""
    rec: dict[str, list] = {"h": [], "o": [], "g": []}

    def on_block(module, args, output):
        rec["o"].append(output)                    # fires inside each step, before the step's gate

    def on_step(module, args, kwargs, output):
        h_prev = args[0] if args else kwargs["h"]
        if not rec["h"]:
            rec["h"].append(h_prev)                # h^(0) = h_pre
        h_next, g = output
        rec["h"].append(h_next)
        rec["g"].append(g)

    handles = [model.recurrence.blocks[-1].register_forward_hook(on_block),
               model.recurrence.register_forward_hook(on_step, with_kwargs=True)]
    try:
        yield rec
    finally:
        for handle in handles:
            handle.remove()


class _Sums:
    """Running totals for one evaluation: per step i = 0..r."""

    def __init__(self, r: int):
        zeros = lambda: [0.0] * (r + 1)  # noqa: E731
        self.loss, self.kl, self.upd, self.prop, self.diff, self.prev = (zeros() for _ in range(6))
        self.g_sum, self.g_sq, self.g_hi, self.g_lo = (zeros() for _ in range(4))
        self.n_targets, self.n_tokens, self.n_gate = 0, 0, 0


def _accumulate_batch(model, x, y, r: int, sums: _Sums, cka: CKAStats | None) -> None:
    """One forward at depth r with hooks, then every exit through coda + head; adds to `sums`."""
    with capture(model) as rec:
        out = model(x, y, r=r, stats=True)
    h, o = rec["h"], rec["o"]                                          # r + 1 and r x (B, T, d)
    vocab = model.cfg.vocab_size
    n_tgt, n_tok = int((y != -1).sum()), y.numel()
    n_gate = rec["g"][0].numel()                                      # B * T * d gate scalars per step
    logp_final = F.log_softmax(out.logits[..., :vocab].float(), -1)   # (B, T, V)
    for i in range(r + 1):
        logits, loss = model.readout(h[i], y) if i < r else (out.logits, out.loss)
        logp = F.log_softmax(logits[..., :vocab].float(), -1)
        sums.loss[i] += float(loss) * n_tgt if n_tgt else 0.0
        sums.kl[i] += float(F.kl_div(logp, logp_final, log_target=True, reduction="sum"))
        if i == 0:
            continue
        hp, hn, oi = h[i - 1].float(), h[i].float(), o[i - 1].float()
        sums.upd[i] += float((hn - hp).square().sum())
        sums.prop[i] += float((oi - hp).square().sum())
        sums.prev[i] += float(hp.square().sum())
        mean, std = float(out.aux["stats"]["gate_mean"][i - 1]), float(out.aux["stats"]["gate_std"][i - 1])
        sums.g_sum[i] += mean * n_gate                                 # pooled std from the unbiased
        sums.g_sq[i] += std ** 2 * (n_gate - 1) + mean ** 2 * n_gate   # per-batch std: sum of g^2
        sums.g_hi[i] += float(out.aux["stats"]["gate_hi"][i - 1]) * n_gate
        sums.g_lo[i] += float(out.aux["stats"]["gate_lo"][i - 1]) * n_gate
    sums.n_targets += n_tgt
    sums.n_tokens += n_tok
    sums.n_gate += n_gate
    if cka is not None:
        cka.update(h)


@dataclasses.dataclass
class Diagnostics:
    """Per-step lists of length r + 1 (index = step 0..r; gate and norm entries are None at step 0)
    and the (r + 1, r + 1) CKA matrix (empty when not computed). JSON-serialisable as is."""

    r: int
    n_tokens: int
    loss: list[float]
    kl_to_final: list[float]
    gate_mean: list[float | None]
    gate_std: list[float | None]
    gate_hi: list[float | None]
    gate_lo: list[float | None]
    update_ratio: list[float | None]
    fixed_point_delta: list[float | None]
    cka: list[list[float]]
    problem: str | None = None
    """None, or why some numbers are undefined (NaN, written as null): the weights or the activations
    are not finite"""

    def to_json(self, path: str | Path | None = None) -> str:
        text = strict_json.dumps(dataclasses.asdict(self), indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    def write_csv(self, path: str | Path) -> None:
        """One row per step 0..r; empty cells where a quantity is undefined (step 0)."""
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(("step",) + STEP_FIELDS)
            for i in range(self.r + 1):
                w.writerow([i] + ["" if getattr(self, k)[i] is None else getattr(self, k)[i] for k in STEP_FIELDS])

    def plot(self, out_dir: str | Path) -> list[Path]:
        """Writes diagnostics_steps.png (every per-step quantity vs step) and cka.png; returns the paths."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = [_plot_steps(self, out_dir / "diagnostics_steps.png")]
        if self.cka:
            paths.append(_plot_cka(self.cka, out_dir / "cka.png"))
        return paths


def _finish(sums: _Sums, r: int, cka: CKAStats | None) -> Diagnostics:
    ratio = lambda a, b: math.sqrt(a / b) if b > 0 else float("nan")  # noqa: E731
    n, rng = sums.n_gate, range(1, r + 1)
    var = [(sums.g_sq[i] - sums.g_sum[i] ** 2 / n) / max(n - 1, 1) for i in rng]
    none = [None]
    return Diagnostics(
        r=r, n_tokens=sums.n_tokens,
        loss=[v / max(sums.n_targets, 1) for v in sums.loss],
        kl_to_final=[v / sums.n_tokens for v in sums.kl],
        gate_mean=none + [sums.g_sum[i] / n for i in rng],
        gate_std=none + [math.sqrt(max(v, 0.0)) for v in var],
        gate_hi=none + [sums.g_hi[i] / n for i in rng],
        gate_lo=none + [sums.g_lo[i] / n for i in rng],
        update_ratio=none + [ratio(sums.upd[i], sums.prop[i]) for i in rng],
        fixed_point_delta=none + [ratio(sums.upd[i], sums.prev[i]) for i in rng],
        cka=cka.matrix() if cka is not None else [])


def _depth(model, r: int | None) -> int:
    """Checks eval mode (no recurrence noise) and returns r (default R = n_loops), r >= 1."""
    if model.training:
        raise ValueError("diagnostics need model.eval(): training mode draws recurrence noise")
    r = model.cfg.n_loops if r is None else int(r)
    if r < 1:
        raise ValueError(f"diagnostics need at least one recurrence step, got r={r}")
    return r


@torch.no_grad()
def diagnose(model, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], r: int | None = None,
             cka: bool = True) -> Diagnostics:
    """Appendix E diagnostics of `model` (a RecurrentGPT in eval mode, on the batches' device) over
    `batches` of (x, y), each (B, T) token ids (targets -1 ignored), at depth r (default R = n_loops;
    any r >= 1, also beyond R). Means are weighted by tokens (loss: by targets != -1), so batches may
    differ in size. cka=False skips the CKA statistics (their memory grows as (r + 1)^2 d^2)."""
    r = _depth(model, r)
    sums = _Sums(r)
    cka_stats = CKAStats(r + 1) if cka else None
    for x, y in batches:
        _accumulate_batch(model, x, y, r, sums, cka_stats)
    if sums.n_tokens == 0:
        raise ValueError("no batches given")
    result = _finish(sums, r, cka_stats)
    result.problem = nonfinite_weights(model)
    if result.problem is None and not all(math.isfinite(v) for v in result.loss + result.kl_to_final):
        result.problem = "the activations are not finite: losses overflow to NaN or inf (the weights are finite)"
    return result


def figure(size: tuple[float, float]):
    """A matplotlib Figure drawn by the Agg canvas, without pyplot (no global backend or state)."""
    return Figure(figsize=size)


def _plot_steps(d: Diagnostics, path: Path) -> Path:
    steps = list(range(d.r + 1))
    rec = steps[1:]
    fig = figure((13, 7))
    axes = fig.subplots(2, 3)
    panels = [("exit loss", [("loss", steps, d.loss)]),
              ("KL(p_final || p_step)", [("KL", steps, d.kl_to_final)]),
              ("gate mean / std", [("mean", rec, d.gate_mean[1:]), ("std", rec, d.gate_std[1:])]),
              ("gate saturation", [("g > 0.95 (copy)", rec, d.gate_hi[1:]), ("g < 0.05 (write)", rec, d.gate_lo[1:])]),
              ("applied update / proposal", [("ratio", rec, d.update_ratio[1:])]),
              ("fixed-point delta", [("delta", rec, d.fixed_point_delta[1:])])]
    for ax, (title, lines) in zip(axes.flat, panels):
        for label, xs, ys in lines:
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("recurrence step")
        ax.set_xticks(steps)
        if len(lines) > 1:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _plot_cka(matrix: list[list[float]], path: Path) -> Path:
    k = len(matrix)
    fig = figure((2.0 + 0.6 * k, 1.0 + 0.6 * k))
    ax = fig.subplots()
    im = ax.imshow(matrix, vmin=0.0, vmax=1.0, cmap="viridis")
    if k <= 16:
        for i in range(k):
            for j in range(k):
                ax.text(j, i, f"{matrix[i][j]:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if matrix[i][j] > 0.5 else "white")
    ax.set_xticks(range(k))
    ax.set_yticks(range(k))
    ax.set_xlabel("step")
    ax.set_ylabel("step")
    ax.set_title("linear CKA between steps")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def label(token: str) -> str:
    """A token string safe as a tick label: line breaks shown as \\n and \\r, no mathtext."""
    return token.replace("\n", "\\n").replace("\r", "\\r").replace("$", "\\$") or "''"


@torch.no_grad()
def gate_heatmap(model, x: torch.Tensor, path: str | Path, decode: Callable[[list[int]], str] | None = None,
                 r: int | None = None) -> torch.Tensor:
    """Per-token gate of one sequence (x: (T,) or (B, T), the first row is used) at depth r (default R):
    g_bar[i, t] = mean over channels of g^(i+1) at position t. Saves a (step x position) heatmap to
    `path` (PNG), token strings decode([id]) on the x axis when decode is given; returns g_bar (r, T)."""
    r = _depth(model, r)
    idx = (x if x.dim() == 2 else x[None])[:1]                          # (1, T)
    with capture(model) as rec:
        model(idx, r=r)
    gbar = torch.stack([g[0].float().mean(-1) for g in rec["g"]]).cpu()  # (r, T)
    T = idx.shape[1]
    fig = figure((max(6.0, 0.35 * T), 1.5 + 0.4 * r))
    ax = fig.subplots()
    im = ax.imshow(gbar.numpy(), aspect="auto", cmap="viridis")
    ax.set_yticks(range(r), [str(i) for i in range(1, r + 1)])
    ax.set_ylabel("step")
    if decode is not None:
        ax.set_xticks(range(T), [label(decode([int(t)])) for t in idx[0]], rotation=90, fontsize=7)
    else:
        ax.set_xlabel("token position")
    ax.set_title("mean gate per token (high = copy, low = write)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return gbar
