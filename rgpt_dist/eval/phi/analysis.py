"""`rgpt-eval phi`: runs -> observations -> the law fitted with phi free, at 0 and at 1, a block
bootstrap for the intervals, and the report; with several groups (the case studies: truncated against
full backpropagation, the gate against plain injection) each group's fit and a comparison of their phi.

    groups_of(runs, ["a=runs/x-*", "b=runs/y-*,runs/z-*"]) -> {"a": [...], "b": [...]}
    analyse(groups, out)   # out/phi.{json,md,png} for one group; out/<name>/... and out/compare.{md,json}

The difference of two groups' phi gets its interval from the two bootstraps, drawn independently (each
group's resamples from its own seed): the k-th resample of one minus the k-th of the other is a draw of
the difference. (The case studies share their r = 1 runs with their baselines: the interval ignores
that overlap, so it is a little wider than a paired one.)
No torch import.
"""
from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Any

import numpy as np

from rgpt_dist import strict_json
from rgpt_dist.eval.phi.fit import PhiInputError, bootstrap, fit_law
from rgpt_dist.eval.phi.report import write_report
from rgpt_dist.eval.phi.runs import read_observations

FIXED = {"phi free": None, "phi = 0": 0.0, "phi = 1": 1.0}
"""The fits of every analysis: the law, and the two readings phi brackets (a recurrence worth nothing,
a recurrence worth a unique block)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def groups_of(runs: list[str], specs: list[str]) -> dict[str, list[str]]:
    """RUNS (one unnamed group) or --group NAME=PATTERN[,PATTERN...] (globs, sorted): the run paths of
    each group (a case study of the sweep: rgpt_dist.studies.phi.grid.study_groups). A pattern that
    matches nothing, a bad or repeated name, or a mix is refused."""
    if bool(runs) == bool(specs):
        raise PhiInputError("give run directories or --group NAME=PATTERN (at least two groups), not both or neither")
    if runs:
        return {"": list(runs)}
    parsed: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, patterns = spec.partition("=")
        if not sep or not _NAME.fullmatch(name) or not patterns:
            raise PhiInputError(f"--group {spec!r}: expected NAME=PATTERN[,PATTERN...] with NAME of letters, "
                                "digits, '_', '.' or '-'")
        if name in parsed:
            raise PhiInputError(f"--group {name!r} is given twice")
        parsed[name] = patterns.split(",")
    if len(parsed) < 2:
        raise PhiInputError("--group compares groups: give at least two (or the runs alone for one fit)")
    return {name: expand(name, patterns) for name, patterns in parsed.items()}


def expand(name: str, patterns: list[str]) -> list[str]:
    """Every path the patterns match (each sorted), refusing a pattern that matches nothing."""
    paths: list[str] = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if not found:
            raise PhiInputError(f"--group {name}: {pattern!r} matches nothing")
        paths += found
    return paths


def fit_group(paths: list[str], *, restarts: int, samples: int, seed: int, boot_seed: int) -> dict[str, Any]:
    """The observations of the runs, the three fits (starts drawn from `seed`) and the bootstrap of the
    free one (resamples from `boot_seed`)."""
    obs, records = read_observations(paths)
    fits = {label: fit_law(obs, phi=phi, restarts=restarts, seed=seed) for label, phi in FIXED.items()}
    boot = bootstrap(obs, samples=samples, seed=boot_seed, restarts=restarts, fit=fits["phi free"])
    sampled = [rec["run"] for rec in records if rec.get("sampled")]
    return {"obs": obs, "records": records, "fits": fits, "boot": boot, "sampled": sampled}


def analyse(groups: dict[str, list[str]], out: Path, *, restarts: int = 500, samples: int = 200,
            seed: int = 0) -> str:
    """Fits every group, writes the reports into `out` and returns the markdown summary."""
    # the k-th group's bootstrap draws from seed + k: the groups' resamples are independent (their
    # cells need not correspond), so the k-th draws' difference is a draw of the difference of phi
    results = {name: fit_group(paths, restarts=restarts, samples=samples, seed=seed, boot_seed=seed + k)
               for k, (name, paths) in enumerate(groups.items())}
    for name, res in results.items():
        write_report(res["obs"], res["fits"], {"phi free": res["boot"].intervals}, out / name if name else out)
    summary = _summary(results)
    if len(results) > 1:
        (out / "compare.md").write_text(summary)
        (out / "compare.json").write_text(strict_json.dumps(_comparison(results), indent=2) + "\n")
    return summary


def _comparison(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per group phi with its interval and R^2 of the three fits; per pair the difference and its interval."""
    groups = {name: {"runs": len(res["obs"]), "phi": res["fits"]["phi free"].phi,
                     "phi_interval": list(res["boot"].intervals["phi"]),
                     "r2": {label: fit.r2 for label, fit in res["fits"].items()},
                     "runs_with_sampled_depth": res["sampled"]} for name, res in results.items()}
    names = list(results)
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            diff = np.asarray(results[a]["boot"].samples["phi"]) - np.asarray(results[b]["boot"].samples["phi"])
            level = results[a]["boot"].level
            lo, hi = np.quantile(diff, [(1 - level) / 2, (1 + level) / 2])
            pairs.append({"a": a, "b": b, "phi_a_minus_b": groups[a]["phi"] - groups[b]["phi"],
                          "interval": [float(lo), float(hi)], "level": level})
    return {"groups": groups, "differences": pairs}


def _summary(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| group | runs | phi [95% CI] | R^2 of log L: phi free / phi = 0 / phi = 1 |", "|---|---|---|---|"]
    for name, res in results.items():
        f, (lo, hi) = res["fits"], res["boot"].intervals["phi"]
        lines.append(f"| {name or 'all'} | {len(res['obs'])} | {f['phi free'].phi:.3f} [{lo:.3f}, {hi:.3f}] | "
                     + " / ".join(f"{f[k].r2:.4f}" for k in FIXED) + " |")
    if len(results) > 1:
        lines.append("")
        for pair in _comparison(results)["differences"]:
            lo, hi = pair["interval"]
            lines.append(f"phi({pair['a']}) - phi({pair['b']}) = {pair['phi_a_minus_b']:+.3f} "
                         f"[{lo:+.3f}, {hi:+.3f}] ({pair['level']:.0%} bootstrap interval)")
    for name, res in results.items():
        if res["sampled"]:
            lines.append(f"note: {len(res['sampled'])} run(s) of {name or 'the fit'} train at a sampled depth; "
                         "their r is E[r], which the law does not model")
    return "\n".join(lines) + "\n"
