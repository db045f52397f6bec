"""One layer's attention of the layerwise Recurrent Transformer in its recurrent order (SPEC section 9):
the exact tiled prefill scan (`scan`, what training and prefill run) and its oracle (`naive_scan`).

At position t (0-based here; the SPEC's 1-based t is t + 1) the layer's query attends over the
PERSISTENT pairs of positions 0..t-1 and the TEMPORARY pair of t; the caller's `step` turns the result
a_t into position t's persistent pair, which only exists once a_t does. So the positions run in order,
but the attention need not read Theta(N^2) keys:

- `naive_scan` reads, at step t, all t persistent keys (a plain softmax): Theta(N^2) key reads.
- `scan` (1-based t = 1..N): once position t's pair exists, the keys of the block ending at t, of size
  lowbit(t) (positions t - lowbit(t) + 1 .. t), are read ONCE and folded, with one batched matmul,
  into the queries of the next block t + 1 .. min(t + lowbit(t), N). The query blocks are dyadic
  (t = c * 2^k, c odd: the right half of an aligned block of size 2^(k+1) whose left half holds the
  keys), so every (query i, key j < i) pair is visited exactly once, query i's keys come in the
  Fenwick decomposition of 1..i-1, and the folds read sum_{t=1}^{N-1} lowbit(t) keys: (N/2) log2 N
  for N a power of two (the fold at t = N has no query left).

Each fold yields, per query of its block, an online-softmax partial: the running max m (B, H), the
denominator l = sum_j exp(s_ij - m) (B, H) and the numerator o = sum_j exp(s_ij - m) v_j (B, H, hd),
in fp32 or the input dtype, whichever is wider. Query t's accumulator is the log-sum-exp merge of its
partials (at most log2 N + 1) with its temporary pair's, taken at step t; merging there rather than
writing into shared (B, H, N) buffers keeps every op out of place, so autograd flows through the scan
(training runs through it) with nothing it saved ever modified. The maxima are only stabilisers (the
result does not depend on them), so they are detached: the gradient is exact and needs no max.

Scores: s_tj = scale * q_t . k_j - slope_h * (t - j) (ALiBi when `slopes` (H,) is given; the temporary
pair is at distance 0). `counter` (tests, benchmarks) receives counter['pairs'] += (N, N) int64 visits
(query, key), the temporary (t, t) pairs on the diagonal, and counter['key_reads'] += the keys read.
No process-group code here: heads are whatever the caller holds (a tensor-parallel rank's share).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

Step = Callable[[int, Tensor], tuple[Tensor, Tensor]]
"""step(t, a_t) -> (k_t, v_t): a_t (B, H, hd) in the input dtype -> position t's persistent pair,
each (B, H, hd)."""


def lowbit(t: int) -> int:
    """The lowest set bit of t >= 1 (t & -t): the size of the key block a fold at 1-based t reads."""
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise ValueError(f"lowbit: t={t!r} must be an integer >= 1")
    return t & -t


def _check(q: Tensor, k_tmp: Tensor, v_tmp: Tensor, scale: float, slopes: Tensor | None,
           counter: dict | None) -> None:
    """Clear errors naming the offending value, before any work."""
    for name, x in (("q", q), ("k_tmp", k_tmp), ("v_tmp", v_tmp)):
        if not isinstance(x, Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a (B, H, N, hd) tensor, got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be floating point, got {x.dtype}")
    if k_tmp.shape != q.shape or v_tmp.shape != q.shape:
        raise ValueError(f"q {tuple(q.shape)}, k_tmp {tuple(k_tmp.shape)} and v_tmp {tuple(v_tmp.shape)} "
                         f"must have the same (B, H, N, hd) shape")
    if q.shape[2] < 1:
        raise ValueError(f"the sequence length N={q.shape[2]} (q's dim 2) must be >= 1")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
        raise ValueError(f"scale={scale!r} must be a finite number > 0")
    if slopes is not None:
        if not isinstance(slopes, Tensor) or tuple(slopes.shape) != (q.shape[1],):
            raise ValueError(f"slopes must be None or an (H,) = ({q.shape[1]},) tensor, got "
                             f"{tuple(slopes.shape) if isinstance(slopes, Tensor) else type(slopes).__name__}")
        if not torch.isfinite(slopes).all():
            raise ValueError(f"slopes must be finite, got {slopes.tolist()}")
    if counter is not None and not isinstance(counter, dict):
        raise ValueError(f"counter must be None or a dict, got {type(counter).__name__}")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 or the input dtype, whichever is wider (fp64 stays fp64, bf16/fp16 accumulate in fp32)."""
    return torch.promote_types(dtype, torch.float32)


def _persistent(step: Step, t: int, a: Tensor) -> tuple[Tensor, Tensor]:
    """Runs the caller's step at position t and checks its pair's shapes, each (B, H, hd) like a."""
    k, v = step(t, a)
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.shape != a.shape:
            raise ValueError(f"step({t}, a) returned {name} of shape "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}; "
                             f"it must be a_t's {tuple(a.shape)} (B, H, hd)")
    return k, v


def _count(counter: dict | None, pairs: Tensor | None, key_reads: int) -> None:
    """counter['pairs'] += pairs, counter['key_reads'] += key_reads (keys created when absent)."""
    if counter is None:
        return
    counter["pairs"] = pairs if counter.get("pairs") is None else counter["pairs"] + pairs
    counter["key_reads"] = counter.get("key_reads", 0) + key_reads


def _fold(qa: Tensor, ks: list[Tensor], vs: list[Tensor], t: int, size: int, n: int, scale: float,
          slopes: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Keys t - size .. t - 1 (0-based) read once, against queries t .. t + n - 1: the block's partials
    m (B, H, n) (detached), l (B, H, n), o (B, H, n, hd), in qa's (accumulation) dtype."""
    kb = torch.stack(ks[t - size:t], dim=2).to(qa.dtype)       # (B, H, size, hd): the keys this fold reads
    vb = torch.stack(vs[t - size:t], dim=2).to(qa.dtype)       # (B, H, size, hd)
    s = scale * (qa[:, :, t:t + n] @ kb.transpose(-1, -2))     # (B, H, n, size)
    if slopes is not None:                                     # distance (query i) - (key j) >= 1
        dist = (torch.arange(t, t + n, device=qa.device)[:, None]
                - torch.arange(t - size, t, device=qa.device)[None, :]).to(qa.dtype)   # (n, size)
        s = s - slopes[:, None, None] * dist                   # (H, 1, 1) * (n, size)
    m = s.amax(-1).detach()                                    # (B, H, n): a stabiliser only
    p = torch.exp(s - m.unsqueeze(-1))                         # (B, H, n, size)
    return m, p.sum(-1), p @ vb


def _merge(parts: list[tuple[Tensor, Tensor, Tensor]]) -> Tensor:
    """Log-sum-exp merge of online-softmax partials (m (B, H), l (B, H), o (B, H, hd)) -> o / l."""
    m = torch.stack([p[0] for p in parts])                     # (P, B, H)
    w = torch.exp(m - m.amax(0).detach())                      # (P, B, H): rescales each partial
    l = (w * torch.stack([p[1] for p in parts])).sum(0)        # (B, H)
    o = (w.unsqueeze(-1) * torch.stack([p[2] for p in parts])).sum(0)   # (B, H, hd)
    return o / l.unsqueeze(-1)


def scan(q: Tensor, k_tmp: Tensor, v_tmp: Tensor, step: Step, *, scale: float,
         slopes: Tensor | None = None, counter: dict | None = None) -> tuple[Tensor, Tensor]:
    """One layer's attention in the layerwise recurrent order, exactly, with the tiled folds (module
    docstring). q, k_tmp, v_tmp: (B, H, N, hd). For t = 0..N-1: a_t over the persistent pairs < t and
    the temporary pair of t, then (k_t, v_t) = step(t, a_t). Returns the persistent (k, v), each
    (B, H, N, hd). Autograd flows through (nothing saved is modified in place)."""
    _check(q, k_tmp, v_tmp, scale, slopes, counter)
    B, H, N, hd = q.shape
    acc = _acc_dtype(q.dtype)
    qa = q.to(acc)                                             # (B, H, N, hd)
    slopes = None if slopes is None else slopes.to(device=q.device, dtype=acc)
    s_tmp = scale * (qa * k_tmp.to(acc)).sum(-1)               # (B, H, N): the temporary pairs, distance 0
    v_acc = v_tmp.to(acc)
    parts: list[list[tuple[Tensor, Tensor, Tensor]]] = [[] for _ in range(N)]   # partials per query
    ks: list[Tensor] = []
    vs: list[Tensor] = []
    pairs = torch.zeros(N, N, dtype=torch.int64) if counter is not None else None
    key_reads = 0
    for t in range(N):
        s = s_tmp[:, :, t]                                     # (B, H)
        e = torch.exp(s - s.detach())                          # (B, H): 1, but carries d/ds
        # position 0 too goes through the merge: q and k_tmp stay in the graph (zero gradients), as in
        # naive_scan, so no parameter is left unused at N = 1
        a = _merge(parts[t] + [(s.detach(), e, e.unsqueeze(-1) * v_acc[:, :, t])])   # (B, H, hd)
        parts[t] = []                                          # merged: the list holds no more partials
        k, v = _persistent(step, t, a.to(q.dtype))
        ks.append(k)
        vs.append(v)
        size = lowbit(t + 1)                                   # the block of keys ending at 1-based t + 1
        n = min(size, N - (t + 1))                             # the next block's queries t+1 .. t+n
        if n > 0:
            m, l, o = _fold(qa, ks, vs, t + 1, size, n, scale, slopes)
            for i, part in enumerate(zip(m.unbind(2), l.unbind(2), o.unbind(2))):
                parts[t + 1 + i].append(part)
            key_reads += size
            if pairs is not None:
                pairs[t + 1:t + 1 + n, t + 1 - size:t + 1] += 1
        if pairs is not None:
            pairs[t, t] += 1                                   # the temporary pair
    _count(counter, pairs, key_reads)
    return torch.stack(ks, dim=2), torch.stack(vs, dim=2)


def naive_scan(q: Tensor, k_tmp: Tensor, v_tmp: Tensor, step: Step, *, scale: float,
               slopes: Tensor | None = None, counter: dict | None = None) -> tuple[Tensor, Tensor]:
    """`scan`'s contract, the oracle: at each t a plain softmax over all persistent keys < t and the
    temporary pair of t (reads t keys at step t: Theta(N^2) in all)."""
    _check(q, k_tmp, v_tmp, scale, slopes, counter)
    B, H, N, hd = q.shape
    acc = _acc_dtype(q.dtype)
    slopes = None if slopes is None else slopes.to(device=q.device, dtype=acc)
    ks: list[Tensor] = []
    vs: list[Tensor] = []
    pairs = torch.zeros(N, N, dtype=torch.int64) if counter is not None else None
    key_reads = 0
    for t in range(N):
        kk = torch.stack(ks + [k_tmp[:, :, t]], dim=2).to(acc)   # (B, H, t + 1, hd): persistent < t, temporary t
        vv = torch.stack(vs + [v_tmp[:, :, t]], dim=2).to(acc)
        s = scale * (q[:, :, t:t + 1].to(acc) @ kk.transpose(-1, -2))   # (B, H, 1, t + 1)
        if slopes is not None:
            dist = torch.arange(t, -1, -1, device=q.device).to(acc)     # (t + 1,): t - j
            s = s - slopes[:, None, None] * dist
        a = (torch.softmax(s, dim=-1) @ vv).squeeze(2)          # (B, H, hd)
        k, v = _persistent(step, t, a.to(q.dtype))
        ks.append(k)
        vs.append(v)
        key_reads += t
        if pairs is not None:
            pairs[t, :t + 1] += 1
    _count(counter, pairs, key_reads)
    return torch.stack(ks, dim=2), torch.stack(vs, dim=2)
