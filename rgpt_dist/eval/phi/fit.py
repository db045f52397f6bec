"""The looped scaling law (issue #26, SPEC section 10): fit L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta.

Units: L is the final validation loss in nats/token, D training tokens, N non-embedding parameters
(N_once: run once per token; N_rec: the looped block, counted once, executed r times). phi says how
many unique copies of the looped block r recurrences are worth (r^phi): 1 = each recurrence a full
block, 0 = no gain over running it once.

The fit follows the paper (and Hoffmann et al.'s Chinchilla fit): with theta = (a, alpha, b, beta, e
[, phi]), A = exp(a), B = exp(b), E = exp(e),
    log L_hat = LSE(a - alpha log N_eff, b - beta log D, e),   N_eff = N_once + r^phi N_rec,
    objective = sum_i Huber_delta(log L_hat_i - log L_i)          (delta = 1e-3),
minimised by L-BFGS-B (scipy) with the analytic gradient (`objective`) from `restarts` starting points
drawn uniformly from the paper's box (BOX); the best objective wins. Every random draw comes from one
numpy Generator seeded per call, so a seed gives bitwise the same fit. Pure numpy / scipy (no torch).

Block bootstrap (`bootstrap`; SPEC: 200 resamples over (budget, r) cells), every draw from one numpy
Generator seeded per call (bitwise reproducible):
1. the full-data fit (fit_law with `restarts` starts, 500 by default, or the one passed in);
2. per resample: draw as many (budget, r) cells as there are, uniformly with replacement; every run of
   a drawn cell enters with the multiplicity of its cell (an objective weight: the same sum as
   duplicated rows). A draw the law cannot be fitted to (fewer distinct cells than free parameters, or
   a single looped r with phi free: check_observations' rules) is drawn again and counted in `redraws`,
   so the intervals are conditional on an identifiable resample;
3. refit by L-BFGS-B from the full-data optimum (the warm start) plus `refit_restarts` points drawn
   uniformly from BOX; the best objective wins (the warm start on ties). Why not 500 fresh starts: a
   resample reweights the same runs, so its optimum lies near the full-data one; 200 x 500 starts
   would take minutes. Why not the warm start alone: with delta = 1e-3, far below the residuals, the
   Huber sum is nearly an L1 sum with many shallow local minima, and the warm start stops in one of them
   in most resamples (14 of 20 on the paper-sized synthetic grid of tests/eval/phi/test_fit.py, phi off
   the best of 200 starts by up to 0.01). Measured there against the best of 200 starts: with 4 random
   starts phi is within 0.0034, with 16 identical in 18 of 20 resamples and within 0.0011 in the other
   two, against a bootstrap spread of phi of ~0.03. `improved` counts the resamples where a random
   start beat the warm start;
4. percentile intervals at `level` for every parameter (E, A, alpha, B, beta, phi; phi fixed: its value).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from rgpt_dist.eval.phi.lbfgsb import Result, minimize_batch
from rgpt_dist.progress import bar

# theta's order; the paper's box for each coordinate (SPEC section 10).
THETA = ("a", "alpha", "b", "beta", "e", "phi")
BOX = {"a": (-5.0, 35.0), "alpha": (0.0, 2.5), "b": (-5.0, 35.0), "beta": (0.0, 2.5), "e": (-3.0, 2.0),
       "phi": (-3.0, 3.0)}
PARAMS = ("E", "A", "alpha", "B", "beta", "phi")  # the reported parameters (bootstrap intervals too)
# L-BFGS-B stopping (scipy.optimize.minimize's options): the objective is ~1e-4..1e-2 (delta-sized Huber
# terms), far below scipy's ftol scale max(|f|, 1): its defaults (2.2e-9, 1e-5) stop ~1e-5 short in phi.
# These reach the best objective of ftol 1e-15 / gtol 1e-10 to 2e-14 relative and phi to 5e-9, at
# 0.8x the iterations (measured on the paper-sized synthetic grid of tests/eval/phi/test_fit.py).
OPTIONS = {"ftol": 1e-12, "gtol": 1e-9, "maxiter": 1000}
MAX_STARTS = 40_000
"""L-BFGS-B starts one lockstep minimisation (`minimise`) may run: fit_law's `restarts`, bootstrap's
`samples` x (1 + refit_restarts). Every start holds its L-BFGS-B workspace and its rows of the batched
objective at once: ~25 KiB per start on the paper-sized grid of tests/eval/phi/test_fit.py (116 runs;
measured: peak RSS over 4,000 restarts and over 200 x 17 bootstrap starts), so 40,000 starts stay under
~1 GiB (and take about a minute on a 2-core machine). A count beyond it is refused before anything is
drawn (rgpt-eval phi --restarts 1e8 would otherwise ask for tens of GiB)."""
REFIT_RESTARTS = 16
"""bootstrap's default random starts per resample beside the warm start (module docstring, step 3)."""
MAX_SAMPLES = MAX_STARTS // (1 + REFIT_RESTARTS)
"""The most bootstrap resamples at the default refit_restarts (2,352): rgpt-eval phi --bootstrap's cap."""


@dataclass(frozen=True)
class Observation:
    """One training run."""
    run: str        # run name / path, used in every error message
    loss: float     # final validation loss L (nats/token), > 0
    tokens: float   # D, training tokens, > 0
    n_once: float   # non-embedding parameters run once per token, > 0
    n_rec: float    # non-embedding parameters of the looped part (counted once), reused r times, >= 0
    r: float        # recurrences, >= 1
    budget: str     # compute-budget label; the bootstrap's block is the (budget, r) cell


class PhiInputError(ValueError):
    """Observations the law cannot be fitted to; the message names the offending runs and values."""


def _names(runs: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(runs[:limit])
    return shown + (f", ... ({len(runs) - limit} more)" if len(runs) > limit else "")


def _number(v: Any) -> float:
    """v as a float; NaN for anything that is not a finite real number (None, inf, a string, a bool)."""
    ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
    return float(v) if ok and math.isfinite(v) else math.nan


def cells(obs: Sequence[Observation]) -> dict[tuple[str, float], list[str]]:
    """The (budget, r) cells in sorted order, each with its runs' names."""
    out: dict[tuple[str, float], list[str]] = {}
    for o in sorted(obs, key=lambda o: (o.budget, o.r)):
        out.setdefault((o.budget, o.r), []).append(o.run)
    return out


def check_observations(obs: Sequence[Observation], *, fixed_phi: float | None) -> None:
    """Raises PhiInputError (naming runs and values) for: no runs; a non-finite or non-positive loss,
    tokens or n_once, n_rec < 0, r < 1; when phi is free, no run with n_rec > 0 or a single distinct r
    among them (phi unidentifiable); fewer distinct (budget, r) cells than free parameters (6, or 5 with
    phi fixed). fixed_phi: None (free) or a finite number."""
    if fixed_phi is not None and not math.isfinite(fixed_phi):
        raise PhiInputError(f"fixed phi must be a finite number, got {fixed_phi!r}")
    if not obs:
        raise PhiInputError("no runs to fit")
    bad = []
    for o in obs:
        v = {k: _number(getattr(o, k)) for k in ("loss", "tokens", "n_once", "n_rec", "r")}
        wrong = [k for k in ("loss", "tokens", "n_once") if not v[k] > 0]
        wrong += [k for k, ok in (("n_rec", v["n_rec"] >= 0), ("r", v["r"] >= 1)) if not ok]
        if wrong:
            bad.append(f"{o.run} ({', '.join(f'{k} = {getattr(o, k)!r}' for k in wrong)})")
    if bad:
        raise PhiInputError("runs with invalid values (loss, tokens, n_once must be finite and > 0, n_rec >= 0, "
                            f"r >= 1): {_names(bad)}")
    if fixed_phi is None:
        looped = [o for o in obs if o.n_rec > 0]
        rs = sorted({o.r for o in looped})
        if len(rs) < 2:
            why = (f"every looped run has r = {rs[0]:g}" if rs else "no run has a looped part (n_rec > 0)")
            raise PhiInputError(f"phi is not identifiable: {why} ({_names([o.run for o in looped or obs])}); "
                                "runs at two or more recurrence counts are needed, or fix phi")
    groups = cells(obs)
    free = 5 if fixed_phi is not None else 6
    if len(groups) < free:
        listed = "; ".join(f"({b}, r = {r:g}): {_names(runs, 4)}" for (b, r), runs in groups.items())
        raise PhiInputError(f"{len(groups)} distinct (budget, r) cells for {free} free parameters "
                            f"(at least {free} needed): {listed}")


@dataclass
class Data:
    """The observations as arrays, shape (n,) each (log of loss in nats, tokens and r; N in params)."""
    log_loss: np.ndarray
    log_tokens: np.ndarray
    n_once: np.ndarray
    n_rec: np.ndarray
    log_r: np.ndarray

    @classmethod
    def of(cls, obs: Sequence[Observation]) -> "Data":
        col = lambda k: np.array([getattr(o, k) for o in obs], dtype=np.float64)  # noqa: E731
        return cls(np.log(col("loss")), np.log(col("tokens")), col("n_once"), col("n_rec"), np.log(col("r")))


def _huber(x: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Huber_delta(x) = x^2 / 2 for |x| <= delta, else delta (|x| - delta / 2), and its derivative
    c = clip(x, -delta, delta): Huber = c (x - c / 2) in both cases."""
    c = np.minimum(np.maximum(x, -delta), delta)
    return c * (x - 0.5 * c), c


def _objective(theta: np.ndarray, d: Data, w: np.ndarray, phi_fixed: float | None,
               delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Batched: theta (k, p) in BOX (p = 5 with phi fixed, else 6), row weights w (k, n) or (1, n).
    Returns sum_i w_i Huber(LSE_i - log L_i), shape (k,), and its gradient over theta, shape (k, p).
    In the box no term of the LSE overflows or underflows (exponents within [-5 - 2.5 log N, 35]), so
    it is summed unshifted."""
    a, alpha, b, beta, e = (theta[:, j:j + 1] for j in range(5))  # (k, 1) each
    phi = theta[:, 5:6] if phi_fixed is None else phi_fixed
    rphi = np.exp(phi * d.log_r) * d.n_rec                # r^phi N_rec, (k, n) (phi fixed: (n,))
    n_eff = d.n_once + rphi
    log_n = np.log(n_eff)
    t_a, t_b = np.exp(a - alpha * log_n), np.exp(b - beta * d.log_tokens)  # A N_eff^-alpha, B D^-beta
    t_e = np.exp(e)
    tot = t_a + t_b + t_e                                 # L_hat, (k, n)
    h, c = _huber(np.log(tot) - d.log_loss, delta)
    q = w * c / tot                                       # d objective / d L_hat
    g_a, g_b = q * t_a, q * t_b                           # d objective / d (a - alpha log N_eff), (b - beta log D)
    grad = [g_a.sum(1), -(g_a * log_n).sum(1), g_b.sum(1), -(g_b @ d.log_tokens), q.sum(1) * t_e[:, 0]]
    if phi_fixed is None:  # d log N_eff / d phi = r^phi N_rec log r / N_eff
        grad.append(-alpha[:, 0] * (g_a * (rphi * d.log_r / n_eff)).sum(1))
    return (w * h).sum(1), np.stack(grad, axis=1)


def objective(obs: Sequence[Observation], theta: Sequence[float], *, phi: float | None = None,
              delta: float = 1e-3) -> tuple[float, np.ndarray]:
    """The fitted objective at theta = (a, alpha, b, beta, e[, phi]) (phi last, absent when `phi` fixes
    it): sum_i Huber_delta(LSE(a - alpha log N_eff, b - beta log D, e) - log L_i), and its analytic
    gradient, shape (len(theta),)."""
    k = 5 if phi is not None else 6
    if len(theta) != k:
        raise ValueError(f"theta needs {k} values ({', '.join(THETA[:k])}), got {len(theta)}")
    out = [f"{n} = {v!r}" for n, v in zip(THETA, theta) if not BOX[n][0] <= v <= BOX[n][1]]
    if out:
        raise ValueError(f"theta outside the fit's box {BOX}: {', '.join(out)}")
    f, g = _objective(np.asarray(theta, dtype=np.float64)[None], Data.of(obs), np.ones((1, len(obs))), phi, delta)
    return float(f[0]), g[0]


@dataclass
class LawFit:
    """A fitted law. E, A, B in nats (A: nats * params^alpha, B: nats * tokens^beta); phi = phi_fixed when
    fixed. objective: the minimised Huber sum; r2: R^2 of log L (the fitted quantity), 1 - sum (log L -
    log L_hat)^2 / sum (log L - mean log L)^2; n_obs runs; restarts: L-BFGS-B starting points tried."""
    E: float
    A: float
    alpha: float
    B: float
    beta: float
    phi: float
    phi_fixed: float | None
    objective: float
    r2: float
    n_obs: int
    restarts: int
    delta: float = 1e-3

    def n_eff(self, n_once: Any, n_rec: Any, r: Any) -> np.ndarray:
        """N_once + r^phi N_rec (params), broadcast over the inputs' shapes."""
        return np.asarray(n_once, dtype=np.float64) + np.power(np.asarray(r, dtype=np.float64), self.phi) * n_rec

    def predict(self, n_once: Any, n_rec: Any, r: Any, tokens: Any) -> np.ndarray:
        """L_hat = E + A N_eff^-alpha + B D^-beta (nats/token), broadcast over the inputs' shapes."""
        d = np.asarray(tokens, dtype=np.float64)
        return self.E + self.A * self.n_eff(n_once, n_rec, r) ** -self.alpha + self.B * d ** -self.beta

    def theta(self) -> np.ndarray:
        """(a, alpha, b, beta, e[, phi]): the optimiser's coordinates."""
        t = [math.log(self.A), self.alpha, math.log(self.B), self.beta, math.log(self.E)]
        return np.array(t + ([self.phi] if self.phi_fixed is None else []))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _bounds(k: int) -> list[tuple[float, float]]:
    return [BOX[name] for name in THETA[:k]]


def draw_inits(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """n starting points, shape (n, k), uniform in the box of the first k coordinates of THETA."""
    lo, hi = np.array(_bounds(k)).T
    return lo + (hi - lo) * rng.random((n, k))


def minimise(d: Data, inits: np.ndarray, phi_fixed: float | None, delta: float,
             w: np.ndarray | None = None, desc: str = "fits") -> Result:
    """L-BFGS-B (OPTIONS) from every row of inits (shape (k, p)), all in lockstep (lbfgsb.py); w: each
    start's row weights, shape (k, n) (None: every run once). A progress bar (`desc`) counts the starts
    that have stopped."""
    w = np.ones((1, len(d.log_loss))) if w is None else w
    fg = lambda x, idx: _objective(x, d, w if len(w) == 1 else w[idx], phi_fixed, delta)  # noqa: E731
    with bar(total=len(inits), desc=desc, unit="fit") as shown:
        return minimize_batch(fg, inits, _bounds(inits.shape[1]), **OPTIONS,
                              finished=lambda n: shown.update(n - shown.n))


def _r2(theta: np.ndarray, d: Data, phi_fixed: float | None) -> float:
    """R^2 on log L of the (unweighted) rows of d."""
    a, alpha, b, beta, e = theta[:5]
    phi = theta[5] if phi_fixed is None else phi_fixed
    n_eff = d.n_once + np.exp(phi * d.log_r) * d.n_rec
    pred = np.logaddexp(np.logaddexp(a - alpha * np.log(n_eff), b - beta * d.log_tokens), e)
    ss_tot = float(((d.log_loss - d.log_loss.mean()) ** 2).sum())
    return 1.0 - float(((d.log_loss - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else math.nan


def law_of(theta: np.ndarray, objective_value: float, d: Data, phi_fixed: float | None, restarts: int,
           delta: float) -> LawFit:
    a, alpha, b, beta, e = (float(v) for v in theta[:5])
    phi = float(theta[5]) if phi_fixed is None else float(phi_fixed)
    return LawFit(E=math.exp(e), A=math.exp(a), alpha=alpha, B=math.exp(b), beta=beta, phi=phi,
                  phi_fixed=None if phi_fixed is None else float(phi_fixed), objective=objective_value,
                  r2=_r2(theta, d, phi_fixed), n_obs=len(d.log_loss), restarts=restarts, delta=delta)


def check_settings(**settings: float) -> None:
    """ValueError naming the first setting out of range: counts >= 1 (restarts and samples at most
    MAX_STARTS), delta > 0, 0 < level < 1."""
    for name, v in settings.items():
        ok = {"delta": lambda x: math.isfinite(x) and x > 0, "level": lambda x: 0 < x < 1}.get(
            name, lambda x: isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 1)(v)
        if not ok:
            raise ValueError(f"{name} = {v!r} is out of range (counts: integers >= 1; delta > 0; 0 < level < 1)")
        if name in ("restarts", "samples") and v > MAX_STARTS:
            raise ValueError(f"{name} = {v!r} is out of range: at most {MAX_STARTS:,} (L-BFGS-B starts run in "
                             f"lockstep, ~25 KiB each: fit.MAX_STARTS keeps them under ~1 GiB)")


def fit_law(obs: Sequence[Observation], *, phi: float | None = None, restarts: int = 500, seed: int = 0,
            delta: float = 1e-3) -> LawFit:
    """The best of `restarts` L-BFGS-B runs from starting points drawn uniformly from BOX with
    numpy.random.default_rng(seed) (phi free when `phi` is None, else fixed at it)."""
    check_settings(restarts=restarts, delta=delta)
    check_observations(obs, fixed_phi=phi)
    d = Data.of(obs)
    inits = draw_inits(np.random.default_rng(seed), restarts, 6 if phi is None else 5)
    res = minimise(d, inits, phi, delta)
    best = int(np.argmin(np.where(np.isfinite(res.fun), res.fun, np.inf)))  # the first on ties
    return law_of(res.x[best], float(res.fun[best]), d, phi, restarts, delta)


_MAX_REDRAWS_PER_SAMPLE = 100


@dataclass
class Bootstrap:
    """The full-data fit, per-resample values (samples[p]: shape (n_samples,) for p in PARAMS; objective:
    each refit's Huber sum) and the percentile intervals {p: (low, high)} at `level`."""
    fit: LawFit
    samples: dict[str, np.ndarray]
    objective: np.ndarray
    intervals: dict[str, tuple[float, float]]
    level: float
    seed: int
    refit_restarts: int
    redraws: int      # resamples drawn again because the law was not identifiable on them
    improved: int     # resamples where a random restart beat the warm start (by > 1e-9 relative)
    n_cells: int

    def to_dict(self) -> dict[str, Any]:
        return {"fit": self.fit.to_dict(), "intervals": {k: list(v) for k, v in self.intervals.items()},
                "level": self.level, "n_samples": len(self.objective), "seed": self.seed,
                "refit_restarts": self.refit_restarts, "redraws": self.redraws, "improved": self.improved,
                "n_cells": self.n_cells, "samples": {k: v.tolist() for k, v in self.samples.items()},
                "objective": self.objective.tolist()}


def _draw_weights(rng: np.random.Generator, cell_rows: list[np.ndarray], looped_r: list[set[float]],
                  n: int, free: int, phi_free: bool) -> tuple[np.ndarray, int]:
    """One resample's row weights, shape (n,), and how many draws were rejected before it."""
    k = len(cell_rows)
    for tries in range(_MAX_REDRAWS_PER_SAMPLE):
        counts = np.bincount(rng.integers(0, k, size=k), minlength=k)
        drawn = np.flatnonzero(counts)
        if len(drawn) >= free and (not phi_free or len(set().union(*(looped_r[c] for c in drawn))) >= 2):
            w = np.zeros(n)
            for c in drawn:
                w[cell_rows[c]] = counts[c]
            return w, tries
    raise PhiInputError(f"{_MAX_REDRAWS_PER_SAMPLE} block-bootstrap draws in a row of the {k} (budget, r) cells "
                        f"left fewer than {free} distinct cells or a single looped r: too few cells to resample")


def resample_weights(obs: Sequence[Observation], samples: int, rng: np.random.Generator, *,
                     phi_free: bool) -> tuple[np.ndarray, int]:
    """Row weights of `samples` block resamples over the (budget, r) cells, shape (samples, n), and the
    number of redraws (step 2 of the module docstring)."""
    keys = sorted({(o.budget, o.r) for o in obs})              # the cells, in fit.cells' order
    rows = [np.array([i for i, o in enumerate(obs) if (o.budget, o.r) == key]) for key in keys]
    looped = [{obs[i].r for i in rs if obs[i].n_rec > 0} for rs in rows]
    free = 6 if phi_free else 5
    out, redraws = np.zeros((samples, len(obs))), 0
    for s in range(samples):
        out[s], tries = _draw_weights(rng, rows, looped, len(obs), free, phi_free)
        redraws += tries
    return out, redraws


def _params(theta: np.ndarray, phi: float | None) -> dict[str, np.ndarray]:
    """theta (k, p) -> {E, A, alpha, B, beta, phi: (k,)}."""
    phis = theta[:, 5] if phi is None else np.full(len(theta), float(phi))
    return {"E": np.exp(theta[:, 4]), "A": np.exp(theta[:, 0]), "alpha": theta[:, 1], "B": np.exp(theta[:, 2]),
            "beta": theta[:, 3], "phi": phis}


def bootstrap(obs: Sequence[Observation], *, phi: float | None = None, samples: int = 200, seed: int = 0,
              level: float = 0.95, refit_restarts: int = REFIT_RESTARTS, restarts: int = 500, delta: float = 1e-3,
              fit: LawFit | None = None) -> Bootstrap:
    """Block-bootstrap percentile intervals (module docstring). fit: the full-data fit to warm-start
    from (None: fit_law(obs, phi=phi, restarts=restarts, seed=seed, delta=delta)); it must be a fit of
    these observations with the same phi and delta."""
    check_settings(samples=samples, restarts=restarts, delta=delta, level=level)
    if not (isinstance(refit_restarts, int) and refit_restarts >= 0):
        raise ValueError(f"refit_restarts = {refit_restarts!r} is out of range (an integer >= 0)")
    total = samples * (1 + refit_restarts)  # one lockstep minimisation of every resample's starts
    if total > MAX_STARTS:
        raise ValueError(f"samples = {samples} x (1 + refit_restarts = {refit_restarts}) = {total:,} L-BFGS-B starts "
                         f"is out of range: at most {MAX_STARTS:,} (~1 GiB: fit.MAX_STARTS), i.e. "
                         f"samples <= {MAX_STARTS // (1 + refit_restarts):,} at this refit_restarts")
    check_observations(obs, fixed_phi=phi)
    if fit is None:
        fit = fit_law(obs, phi=phi, restarts=restarts, seed=seed, delta=delta)
    elif fit.phi_fixed != phi or fit.delta != delta or fit.n_obs != len(obs):
        raise ValueError(f"the fit passed has phi_fixed = {fit.phi_fixed}, delta = {fit.delta}, n_obs = {fit.n_obs}; "
                         f"this bootstrap has phi = {phi}, delta = {delta}, {len(obs)} runs")
    rng = np.random.default_rng(seed)
    w, redraws = resample_weights(obs, samples, rng, phi_free=phi is None)
    starts = 1 + refit_restarts
    warm = fit.theta()
    inits = np.concatenate([np.concatenate([warm[None], draw_inits(rng, refit_restarts, len(warm))])
                            for _ in range(samples)])          # (samples * starts, p), warm start first
    res = minimise(Data.of(obs), inits, phi, delta, np.repeat(w, starts, axis=0), desc="bootstrap fits")
    fun = np.where(np.isfinite(res.fun), res.fun, np.inf).reshape(samples, starts)
    best = np.argmin(fun, axis=1)                               # the first (the warm start) on ties
    theta = res.x.reshape(samples, starts, -1)[np.arange(samples), best]
    improved = int(np.sum(fun[np.arange(samples), best] < fun[:, 0] - 1e-9 * np.abs(fun[:, 0])))
    values = _params(theta, phi)
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    intervals = {p: tuple(float(x) for x in np.percentile(values[p], q)) for p in PARAMS}
    return Bootstrap(fit=fit, samples=values, objective=fun[np.arange(samples), best], intervals=intervals,
                     level=level, seed=seed, refit_restarts=refit_restarts, redraws=redraws, improved=improved,
                     n_cells=len(cells(obs)))
