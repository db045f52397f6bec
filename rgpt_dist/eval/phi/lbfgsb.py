"""scipy's L-BFGS-B, many starting points in lockstep: one batched objective call per round.

The phi fit runs hundreds of L-BFGS-B minimisations of a small objective (~100 runs, 6 parameters);
one at a time, numpy's per-call overhead dominates (~30 us per evaluation of 116 runs, ~200
evaluations per start: 500 starts took 4.5 s, here ~0.6 s, both measured on the 2-core machine). L-BFGS-B is written in
reverse communication: `setulb` returns asking for f and g at x (task FG), or reports a new
iterate, convergence or a stop. `minimize_batch` keeps one such state per starting point and
answers every pending FG request of a round with a single call of the batched objective, so the
arithmetic runs on (k, n) arrays. Each start follows exactly the iterates of
scipy.optimize.minimize(method="L-BFGS-B") with the same options: this is a copy of the driver loop
of scipy/optimize/_lbfgsb_py.py (_minimize_lbfgsb, scipy 1.17.1, pinned in constraints.txt), and
tests/eval/phi/test_fit.py checks that the two agree bitwise, so a scipy change to the private
`_lbfgsb.setulb` interface fails that test rather than changing results silently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.optimize import _lbfgsb  # the compiled L-BFGS-B of scipy.optimize.minimize
from threadpoolctl import threadpool_limits  # a dependency (pyproject.toml)

_FG, _NEW_X, _STOP = 3, 1, 5
_MAXITER, _MAXFUN = 504, 502  # task codes scipy sets for its own limits


@dataclass
class Result:
    """Per start: x (k, p) the final points, fun (k,) their objective, nit / nfev (k,) counts,
    status (k,) scipy's task code (4: converged; 5: stopped by a limit; 6-8: warning/abnormal)."""
    x: np.ndarray
    fun: np.ndarray
    nit: np.ndarray
    nfev: np.ndarray
    status: np.ndarray


class _State:
    """One L-BFGS-B run's workspace, laid out as _minimize_lbfgsb lays it out (n parameters, m corrections);
    x, f and g are views of row i of the batch's X (k, n), F (k, 1) and G (k, n), so that a round
    gathers and scatters every pending run with one indexing operation."""

    def __init__(self, i: int, X: np.ndarray, F: np.ndarray, G: np.ndarray, m: int):
        n = X.shape[1]
        self.x, self.f, self.g = X[i], F[i].reshape(()), G[i]  # views (f: 0-d, as setulb wants)
        self.wa = np.zeros(2 * m * n + 5 * n + 11 * m * m + 8 * m, np.float64)
        self.iwa = np.zeros(3 * n, dtype=np.int32)
        self.task = np.zeros(2, dtype=np.int32)
        self.ln_task = np.zeros(2, dtype=np.int32)
        self.lsave = np.zeros(4, dtype=np.int32)
        self.isave = np.zeros(44, dtype=np.int32)
        self.dsave = np.zeros(29, dtype=np.float64)
        self.nit = 0


def minimize_batch(fg: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]], x0: np.ndarray,
                   bounds: list[tuple[float, float]], *, ftol: float = 2.2204460492503131e-09,
                   gtol: float = 1e-5, maxiter: int = 15000, maxfun: int = 15000, maxcor: int = 10,
                   maxls: int = 20, finished: Callable[[int], object] | None = None) -> Result:
    """L-BFGS-B from each row of x0 (shape (k, p)) within finite bounds (p pairs), options as in
    scipy.optimize.minimize. fg(X, idx) returns the objective (j,) and gradient (j, p) at the rows
    X (j, p) of the starts idx (j,) (so a start may carry its own data, e.g. bootstrap weights).
    BLAS runs on one thread meanwhile: L-BFGS-B's m x m products are tiny, and a second thread's
    synchronisation made setulb ~50x slower on a loaded 2-core machine (measured). `finished(n)`, if
    given, hears after each lockstep round how many starts have stopped (a progress bar's count)."""
    lo, hi = (np.ascontiguousarray(v) for v in np.array(bounds, dtype=np.float64).T)
    x0 = np.clip(np.asarray(x0, dtype=np.float64), lo, hi)
    nbd = np.full(x0.shape[1], 2, dtype=np.int32)  # 2: bounded below and above (finite box only)
    factr = ftol / np.finfo(float).eps
    X, F, G = x0.copy(), np.zeros((len(x0), 1)), np.zeros_like(x0)
    nfev = np.zeros(len(x0), dtype=np.int64)
    states = [_State(i, X, F, G, maxcor) for i in range(len(x0))]
    active = list(range(len(states)))
    with threadpool_limits(1, user_api="blas"):
        while active:
            pending, going = [], []
            for i in active:
                s = states[i]
                _lbfgsb.setulb(maxcor, s.x, lo, hi, nbd, s.f, s.g, factr, gtol, s.wa, s.iwa, s.task, s.lsave,
                               s.isave, s.dsave, maxls, s.ln_task)
                if s.task[0] == _FG:
                    pending.append(i)
                elif s.task[0] == _NEW_X:
                    s.nit += 1  # scipy stops at its limits by setting task STOP and calling setulb once more
                    if s.nit >= maxiter:
                        s.task[:] = (_STOP, _MAXITER)
                    elif nfev[i] > maxfun:
                        s.task[:] = (_STOP, _MAXFUN)
                else:
                    continue  # converged, stopped, warning or abnormal: this run is over
                going.append(i)
            if pending:
                idx = np.array(pending)
                F[idx, 0], G[idx] = fg(X[idx], idx)
                nfev[idx] += 1
            active = going
            if finished is not None:
                finished(len(states) - len(active))
    fun = fg(X, np.arange(len(X)))[0]  # at the final x whatever the stop (scipy: the last evaluation)
    return Result(x=X, fun=np.asarray(fun, dtype=np.float64), nit=np.array([s.nit for s in states]),
                  nfev=nfev, status=np.array([int(s.task[0]) for s in states]))
