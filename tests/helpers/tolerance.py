"""Tolerances for fp32 results that cross kernel paths, derived from the float format and a float64
run of the same computation, never from one machine's rounding.

Two fp32 computations of the same quantity that differ only in the order of their roundings (another
GEMM kernel on another CPU generation, a tensor-parallel split, another reduction order) each sit
within the computation's own fp32 error of the exact value. The float64 run of the reference
measures that error on the host at hand (`ref_err = |ref32 - ref64|`, its maximum over elements), so

    |a32 - b32| <= |a32 - exact| + |b32 - exact| ~ 2 ref_err

and `fp32_bound` allows twice that (`factor` 4) for the spread of rounding errors between the two
paths, plus `ulps` units in the last place of the quantity's scale: the floor where the reference
happens to round almost exactly (a loss that is one rounding of a sum). A real error (a wrong slice,
a missing term, a dropped gradient) is orders of magnitude above either term.

Bitwise comparisons stay where equality holds by construction: one process and its kernels
(resume against an uninterrupted run, data-parallel replicas, a state dict split and merged)."""
from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps  # 2^-23: one unit in the last place at 1.0


def fp32_bound(ref_err: float, scale: float, factor: float = 4.0, ulps: float = 4.0) -> float:
    """The largest acceptable |a32 - b32| for two fp32 paths of one computation whose float64 run is
    `ref_err` away from the fp32 reference; `scale` is the quantity's magnitude (its max |value|)."""
    return factor * ref_err + ulps * EPS32 * scale


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64 (neither side rounded again)."""
    return (a.double() - b.double()).abs().max().item()


def tp_matches(got: dict) -> bool:
    """A tests.parallel.tp_equal result: the tp = 2 loss, logits and gradients each within fp32_bound
    of the tp = 1 reference (`key` against `key_ref` and `key_scale`)."""
    return all(got[k] <= fp32_bound(got[f"{k}_ref"], got[f"{k}_scale"]) for k in ("loss", "logits", "grads"))


@torch.no_grad()
def logits_bound(model: torch.nn.Module, ids: torch.Tensor, vocab: int | None = None, **kw) -> float:
    """fp32_bound for two float32 paths to `model`'s logits on `ids` (the first `vocab` of them, where
    the model pads its vocabulary): from the float32 model's distance to its float64 twin."""
    import copy

    got, exact = (m(ids, **kw).logits[..., :vocab] for m in (model, copy.deepcopy(model).double()))
    return fp32_bound(max_abs(got, exact), exact.abs().max().item())
