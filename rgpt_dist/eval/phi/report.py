"""The phi report (issue #26): phi.json, phi.md and phi.png for fits of the looped scaling law.

`write_report(obs, fits, intervals, out_dir)` takes the observations, the fits by name (e.g. "phi free",
"phi = 0", "phi = 1") and each fit's bootstrap intervals {parameter: (low, high)}, and writes
- phi.json: the law, the observations, every fit (LawFit.to_dict), the intervals and each fit's R^2
  (on log L, the fitted quantity); strict JSON (NaN / inf as null, rgpt_dist.strict_json);
- phi.md: one table row per fit (phi [CI], alpha, beta, E, A, B, R^2, n), every interval, and what the
  free fit's phi means for the grid's recurrence counts;
- phi.png: one panel per fit, the loss with the fit's data term removed (L - B D^-beta) against the
  fit's effective parameters N_eff = N_once + r^phi N_rec (log axis), markers coloured by r, with the
  fitted curve E + A N_eff^-alpha.
No torch import; matplotlib draws on the Agg canvas without pyplot (no global state).
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from rgpt_dist import markdown as mdtext, strict_json
from rgpt_dist.eval.phi.fit import PARAMS, LawFit, Observation
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

LAW = "L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta"
R2_NOTE = "R^2 of log L (the fitted quantity): 1 - sum (log L - log L_hat)^2 / sum (log L - mean log L)^2"
Intervals = Mapping[str, Mapping[str, tuple[float, float]]]


def _check(obs: Sequence[Observation], fits: Mapping[str, LawFit], intervals: Intervals) -> None:
    if not fits:
        raise ValueError("no fits to report")
    extra = sorted(set(intervals) - set(fits))
    if extra:
        raise ValueError(f"intervals for fits that are not reported: {', '.join(extra)}")
    for name, fit in fits.items():
        if fit.n_obs != len(obs):
            raise ValueError(f"fit {name!r} has n_obs = {fit.n_obs}, the report has {len(obs)} observations")


def to_json(obs: Sequence[Observation], fits: Mapping[str, LawFit], intervals: Intervals, level: float) -> dict:
    return {"law": LAW, "r2_definition": R2_NOTE, "level": level,
            "observations": [asdict(o) for o in obs],
            "fits": {name: fit.to_dict() for name, fit in fits.items()},
            "intervals": {name: {p: list(v) for p, v in iv.items()} for name, iv in intervals.items()},
            "r2": {name: fit.r2 for name, fit in fits.items()}}


def _g(x: float, spec: str = ".3f") -> str:
    return "-" if x is None or not np.isfinite(x) else format(x, spec)


def _phi_cell(fit: LawFit, iv: Mapping[str, tuple[float, float]] | None) -> str:
    if fit.phi_fixed is not None:
        return f"{_g(fit.phi)} (fixed)"
    if iv and "phi" in iv:
        return f"{_g(fit.phi)} [{_g(iv['phi'][0])}, {_g(iv['phi'][1])}]"
    return _g(fit.phi)


def meaning(phi: float, rs: Sequence[float]) -> str:
    """The sentence that reads phi for the grid's recurrence counts rs (those > 1)."""
    rs = sorted({float(r) for r in rs if r > 1}) or [2.0, 4.0, 8.0]
    worth = ", ".join(f"r = {r:g}: {r ** phi:.2f}" for r in rs)
    each = ", ".join(f"{r ** phi / r:.2f}" for r in rs)
    return (f"phi = {phi:.3f} means one recurrence is worth r^phi / r of a unique block: r recurrences of the "
            f"looped block count as r^phi unique copies of its parameters in N_eff = N_once + r^phi N_rec "
            f"({worth} copies; per recurrence {each}). phi = 1: every recurrence is a full block; "
            f"phi = 0: looping adds nothing over one pass.")


def markdown(obs: Sequence[Observation], fits: Mapping[str, LawFit], intervals: Intervals, level: float) -> str:
    pct = f"{100 * level:g}%"
    first = next(iter(fits.values()))
    n_cells = len({(o.budget, o.r) for o in obs})
    out = ["# The looped scaling law (phi)", "",
           f"{LAW}, fitted to {len(obs)} runs in {n_cells} (budget, r) cells: Huber (delta = {first.delta:g}) "
           f"on log L, L-BFGS-B, best of {first.restarts} restarts (SPEC section 10). {R2_NOTE}. "
           f"Intervals: {pct} block bootstrap over (budget, r) cells.", "",
           f"| fit | phi [{pct} CI] | alpha | beta | E | A | B | R^2 | n |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, f in fits.items():
        cells = [mdtext.cell(name), _phi_cell(f, intervals.get(name)), _g(f.alpha), _g(f.beta), _g(f.E),
                 _g(f.A, ".4g"), _g(f.B, ".4g"), _g(f.r2, ".4f"), str(f.n_obs)]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    for name, iv in intervals.items():
        listed = ", ".join(f"{p} [{_g(iv[p][0], '.4g')}, {_g(iv[p][1], '.4g')}]" for p in PARAMS if p in iv)
        out.append(f"- {mdtext.cell(name)} ({pct}): {listed}")
    free = [f for f in fits.values() if f.phi_fixed is None]
    if free:
        out += ["", meaning(free[0].phi, [o.r for o in obs])]
    return "\n".join(out) + "\n"


def plot(obs: Sequence[Observation], fits: Mapping[str, LawFit], path: Path) -> Path:
    """One panel per fit: L - B D^-beta against N_eff (log x), coloured by r, and E + A N_eff^-alpha."""
    loss, tokens = np.array([o.loss for o in obs]), np.array([o.tokens for o in obs])
    n_once, n_rec, r = (np.array([getattr(o, k) for o in obs]) for k in ("n_once", "n_rec", "r"))
    rs = sorted(set(r.tolist()))
    colours = colormaps["viridis"](np.linspace(0, 0.9, len(rs)))
    fig = Figure(figsize=(4.5 * len(fits), 4))
    FigureCanvasAgg(fig)
    for ax, (name, f) in zip(np.atleast_1d(fig.subplots(1, len(fits))), fits.items()):
        n_eff = f.n_eff(n_once, n_rec, r)                    # params, shape (n,)
        y = loss - f.B * tokens ** -f.beta                   # nats: the data term removed
        for rv, colour in zip(rs, colours):
            sel = r == rv
            ax.scatter(n_eff[sel], y[sel], s=14, color=colour, label=f"r = {rv:g}")
        grid = np.geomspace(n_eff.min(), n_eff.max(), 100)
        ax.plot(grid, f.E + f.A * grid ** -f.alpha, color="black", lw=1, label="E + A N_eff^-alpha")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # a span under a decade labels its minor ticks, overlapping
        ax.set(xlabel=f"N_eff = N_once + r^{f.phi:.3g} N_rec (params)", ylabel="L - B D^-beta (nats/token)",
               title=f"{name}: phi = {f.phi:.3f}, R^2 = {_g(f.r2, '.4f')}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def write_report(obs: Sequence[Observation], fits: Mapping[str, LawFit], intervals: Intervals,
                 out_dir: str | Path, *, level: float = 0.95) -> dict[str, Path]:
    """Writes phi.json, phi.md and phi.png under out_dir (created); returns their paths by suffix."""
    _check(obs, fits, intervals)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "phi.json", "md": out / "phi.md", "png": out / "phi.png"}
    paths["json"].write_text(strict_json.dumps(to_json(obs, fits, intervals, level), indent=2) + "\n")
    paths["md"].write_text(markdown(obs, fits, intervals, level))
    plot(obs, fits, paths["png"])
    return paths
