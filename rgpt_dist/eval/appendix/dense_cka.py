"""E.4 (cross-model CKA): which layer of a dense model each recurrence step's state resembles.

For the recurrent model's states h^(i), i = 0..r (h^(0) = h_pre, the prelude output), and the dense
model's residual stream z^(l), l = 0..L (l = 0: the embeddings wte + wpe, l >= 1: the output of block
l), both run on the same token ids:

    cka[i][l] = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)

the linear CKA (Kornblith et al. 2019, rgpt_dist.eval.appendix.diagnostics.linear_cka) with X = h^(i) as an
(n, d) matrix and Y = z^(l) as an (n, d_dense) matrix, n = every token of every batch (the samples;
targets play no role), features centered over those n tokens. Widths may differ (d != d_dense); the
vocabularies must be equal, since the same ids feed both models. Per step: the best-matching dense
layer argmax_l cka[i][l] and its CKA (the paper's Fig. 12(b)).

Accumulation (our choice): a cross-only variant of diagnostics.CKAStats. CKAStats over all
k = (r + 1) + (L + 1) representations would hold k (k + 1) / 2 cross products; CKA between two
steps or between two dense layers is not needed here, so we keep the (r + 1)(L + 1) cross products
X_i^T Z_l plus the k self products X^T X (for the norms): for r = 6 and GPT-2 Large (L = 36) 303
instead of 990 d x d float64 matrices. Exact over all tokens, independent of their number.
"""
from __future__ import annotations

import contextlib

import torch

from rgpt_dist.eval.appendix.common import Context, Result, check_model, figure, save_figure, trace
from rgpt_dist.eval.appendix.diagnostics import CKAStats
from matplotlib.ticker import MaxNLocator

NAME = "dense_cka"
TITLE = "E.4: cross-model CKA between recurrence steps and a dense model's layers"
NEEDS: tuple[str, ...] = ("dense",)


class CrossCKAStats(CKAStats):
    """CKAStats over k_a + k_b representations (group a first) that accumulates only the self products
    and the a-b cross products: the (k_a, k_b) block of CKAStats' matrix."""

    def __init__(self, k_a: int, k_b: int):
        super().__init__(k_a + k_b)
        self.k_a, self.k_b = k_a, k_b
        self.pairs = [(i, i) for i in range(self.k)] + [(i, k_a + j) for i in range(k_a) for j in range(k_b)]

    def update(self, states: list[torch.Tensor]) -> None:
        """states: k_a + k_b tensors (..., d_i) with the same leading (token) shape."""
        xs = [s.reshape(-1, s.shape[-1]).double() for s in states]   # k x (n, d_i)
        self.n += xs[0].shape[0]
        for i, x in enumerate(xs):
            self.sums[i] = x.sum(0) if self.sums[i] is None else self.sums[i] + x.sum(0)
        for i, j in self.pairs:
            c = xs[i].T @ xs[j]                                       # (d_i, d_j)
            self.cross[i, j] = c if (i, j) not in self.cross else self.cross[i, j] + c

    def cross_matrix(self) -> list[list[float]]:
        """(k_a, k_b) CKA between every representation of group a and every one of group b."""
        norm = [self._centered(i, i).norm() for i in range(self.k)]
        return [[float(self._centered(i, self.k_a + j).square().sum() / (norm[i] * norm[self.k_a + j]))
                 for j in range(self.k_b)] for i in range(self.k_a)]


@contextlib.contextmanager
def dense_layers(dense):
    """Hooks on the dense model's embeddings and blocks: yields a list that one forward fills with
    z^(0..L), each (B, T, d_dense), in execution order; hooks removed on exit."""
    outs: list[torch.Tensor] = []
    modules = [dense.embed, *dense.blocks]
    handles = [m.register_forward_hook(lambda module, args, output: outs.append(output)) for m in modules]
    try:
        yield outs
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def cross_cka(model, dense, batches, r: int) -> list[list[float]]:
    """(r + 1, L + 1) CKA between h^(i) and z^(l), pooled over every token of every batch."""
    if dense.cfg.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"dense model vocabulary ({dense.cfg.vocab_size}) differs from the recurrent "
                         f"model's ({model.cfg.vocab_size}): the same token ids must feed both")
    stats = CrossCKAStats(r + 1, len(dense.blocks) + 1)
    for x, _ in batches:
        with dense_layers(dense) as z:
            dense(x)
        stats.update(trace(model, x, r).h + z)                        # (r + 1) + (L + 1) x (B, T, d)
    return stats.cross_matrix()


def best_layers(matrix: list[list[float]]) -> list[tuple[int, float]]:
    """Per step: (the dense layer of highest CKA, that CKA)."""
    return [max(enumerate(row), key=lambda lc: lc[1]) for row in matrix]


def run(ctx: Context) -> Result:
    r = check_model(ctx.model, ctx.r)
    matrix = cross_cka(ctx.model, ctx.dense, ctx.batches, r)         # (r + 1, L + 1)
    best = best_layers(matrix)
    n_layers = len(matrix[0]) - 1
    data = {"r": r, "dense_layers": n_layers, "cka": matrix,
            "best_layer": [b[0] for b in best], "best_cka": [b[1] for b in best]}
    rows = [{"step": i, "best_layer": layer, "best_cka": c, **{f"layer_{l}": v for l, v in enumerate(matrix[i])}}
            for i, (layer, c) in enumerate(best)]
    summary = [f"| step | best dense layer | CKA | CKA with layer 0 | CKA with layer {n_layers} |",
               "|---|---|---|---|---|"]
    summary += [f"| {i} | {layer} | {c:.3f} | {matrix[i][0]:.3f} | {matrix[i][-1]:.3f} |"
                for i, (layer, c) in enumerate(best)]
    order = "never decreases" if all(a[0] <= b[0] for a, b in zip(best, best[1:])) else "decreases at least once"
    summary.append(f"Of dense layers 0..{n_layers}, the prelude output (step 0) matches layer {best[0][0]} best "
                   f"(CKA {best[0][1]:.3f}) and the final step {r} matches layer {best[-1][0]} "
                   f"(CKA {best[-1][1]:.3f}); the best-matching layer {order} over the steps.")
    result = Result(NAME, TITLE, data, rows, summary, [_plot(matrix, best, ctx.out / f"{NAME}.png")])
    result.save(ctx.out)
    return result


def _plot(matrix: list[list[float]], best: list[tuple[int, float]], path):
    """(a) the (step x dense layer) CKA heatmap with each step's best layer marked, (b) CKA vs layer per step."""
    steps, n_layers = len(matrix), len(matrix[0])
    fig = figure((12, 1.5 + 0.5 * steps))
    ax_map, ax_lines = fig.subplots(1, 2)
    im = ax_map.imshow(matrix, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax_map.scatter([b[0] for b in best], range(steps), marker="*", color="red", label="best layer")
    ax_map.set_yticks(range(steps))
    ax_map.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_map.set_xlabel("dense layer (0 = embeddings)")
    ax_map.set_ylabel("recurrence step (0 = prelude)")
    ax_map.set_title("(a) linear CKA, recurrent state vs dense layer")
    ax_map.legend(loc="lower right", fontsize=7)
    fig.colorbar(im, ax=ax_map)
    for i, row in enumerate(matrix):
        ax_lines.plot(range(n_layers), row, marker=".", label=f"step {i}")
    ax_lines.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_lines.set_xlabel("dense layer")
    ax_lines.set_ylabel("CKA")
    ax_lines.set_title("(b) CKA per step")
    ax_lines.legend(fontsize=7)
    return save_figure(fig, path)
