"""Training runs -> observations of the looped scaling law (`rgpt-eval phi`, issue #26).

Each run directory is read through the grid's run reader (rgpt_dist.eval.grid.summarize_run, which
tolerates a torn or hostile run and names what is wrong), so a phi fit sees exactly the numbers
`rgpt-eval grid` prints:

    loss     the validation loss of the final step (an evaluation at max_steps; a run without one is
             refused, named)
    tokens   D = steps x tokens per step
    n_once   non-embedding parameters run once per token  } rgpt_dist.flops.param_split: the family
    n_rec    the looped part's parameters, counted once   } spec says which are reused every step
    r        the training depth: R for a fixed depth, E[r] under a depth sampler (recorded as such), 1
             for a model without a depth
    budget   the run's total training FLOPs (3 x Eq. 1 at E[r], head included, x tokens); runs within
             BUDGET_TOLERANCE of each other share a compute budget, and (budget, r) is the bootstrap cell

No torch import.
"""
from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any

from rgpt_dist.config import load_config
from rgpt_dist.durable import UnsafePath, open_regular
from rgpt_dist.eval.grid import FINISHED, summarize_run
from rgpt_dist.eval.phi.fit import Observation, PhiInputError
from rgpt_dist.flops import expected_depth, param_split
from rgpt_dist.models.spec import spec_for

BUDGET_TOLERANCE = 0.10
"""Runs whose training FLOPs differ by less than this fraction share a budget (a sweep's runs reach
their nominal budget within a step's worth; its budgets are x2.15 apart)."""


def run_dirs(paths: list[str | Path]) -> list[Path]:
    """Each path is a run directory (it holds config.yaml or metrics.jsonl) or a directory of them. A
    run reached twice is refused naming both paths, since it would enter the fit twice and weigh
    double: the same directory by two spellings (a folder and one of its runs, a symbolic link,
    `a/../a`, a second mount: one (device, inode)), or two copies of one run (byte-identical
    config.yaml and metrics.jsonl, compared by SHA-256; the trainer writes log.run_dir into
    config.yaml, so two distinct runs never match)."""
    out: list[Path] = []
    seen: dict[tuple, tuple[Path, Path]] = {}
    for path in map(Path, paths):
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is not a directory")
        runs = [path] if _is_run(path) else sorted(p for p in path.iterdir() if p.is_dir() and _is_run(p))
        if not runs:
            raise PhiInputError(f"{path}: no run directories (config.yaml + metrics.jsonl) in it")
        for run in runs:
            st, digest = run.stat(), _content_digest(run)
            first = seen.setdefault(("dir", st.st_dev, st.st_ino), (run, path))
            if first != (run, path):
                raise PhiInputError(f"{_named(run, path)} is also {_named(*first)}: the same directory (a folder "
                                    "and one of its runs, a link or another spelling of its path); each run may "
                                    "enter the fit once: give it once")
            first = seen.setdefault(("content", digest), (run, path)) if digest else (run, path)
            if first != (run, path):
                raise PhiInputError(f"{_named(run, path)} and {_named(*first)} hold the same config.yaml and "
                                    f"metrics.jsonl (sha256 {digest[:16]}): two copies of one run; each run may "
                                    "enter the fit once: give one of them")
            out.append(run)
    return out


def _named(run: Path, given: Path) -> str:
    """The run as the user reached it: its path, and the folder it was found in when not given itself."""
    return str(run) if run == given else f"{run} (in {given})"


def _content_digest(run: Path) -> str | None:
    """SHA-256 of the two files' SHA-256s (config.yaml, metrics.jsonl), or None when either is not a
    regular file that opens (a link is not followed, a FIFO never blocks: durable.open_regular); the
    run's reader then names what is wrong with it."""
    parts = []
    for name in ("config.yaml", "metrics.jsonl"):
        try:
            fd = open_regular(run / name, os.O_RDONLY)
        except (UnsafePath, OSError):
            return None
        h = hashlib.sha256()
        with os.fdopen(fd, "rb") as f:
            while chunk := f.read(1 << 20):                                      # streamed: no size cap needed
                h.update(chunk)
        parts.append(h.digest())
    return hashlib.sha256(b"".join(parts)).hexdigest()


def _is_run(path: Path) -> bool:
    return (path / "config.yaml").is_file() or (path / "metrics.jsonl").is_file()


def observe(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    """(fields of one Observation without its budget label, None) or (partial fields, why it is unusable)."""
    row = summarize_run(run_dir, stale_after_s=None)
    fields: dict[str, Any] = {"run": str(run_dir), "flops": row.get("train_flops_total")}
    if row["problem"]:
        return fields, f"unreadable: {row['problem']}"
    if row["status"] != FINISHED:
        return fields, f"not finished ({row['progress']} steps)"
    if row["val_loss"] is None or row["val_step"] != row["max_steps"]:
        last = "no evaluation at all" if row["val_step"] is None else f"the last at step {row['val_step']}"
        return fields, f"no final validation loss (an evaluation at step {row['max_steps']}; {last})"
    if not math.isfinite(row["val_loss"]):
        return fields, f"final validation loss {row['val_loss']} is not finite"
    model = load_config(run_dir / "config.yaml").model
    n_once, n_rec = param_split(model)
    depth = expected_depth(model)
    fields.update(loss=float(row["val_loss"]), tokens=float(row["tokens_seen"]), n_once=float(n_once),
                  n_rec=float(n_rec), r=1.0 if depth is None else float(depth), sampled=_sampled(model))
    return fields, None


def _sampled(model) -> bool:
    """Whether the training depth is drawn (then r is E[r], not a depth every step ran)."""
    sampler = spec_for(model).depth_sampler(model)
    return sampler is not None and len(sampler.pmf()) > 1


def budget_labels(flops: list[float]) -> list[str]:
    """A label per run: runs are grouped by training FLOPs, each group within BUDGET_TOLERANCE of its
    smallest member, labelled by that member to 3 significant digits ('4.64e+17')."""
    labels: dict[int, str] = {}
    anchor = None
    for i in sorted(range(len(flops)), key=lambda k: flops[k]):
        if anchor is None or flops[i] > anchor * (1 + BUDGET_TOLERANCE):
            anchor = flops[i]
        labels[i] = f"{anchor:.3g}"
    return [labels[i] for i in range(len(flops))]


def read_observations(paths: list[str | Path]) -> tuple[list[Observation], list[dict[str, Any]]]:
    """Every run under `paths` as an Observation, and the per-run records (for the report). Any run
    that cannot be used stops the fit with one error naming every such run and why: a fit that
    silently dropped runs would change the law without saying so."""
    fields, bad = [], []
    for run in run_dirs(paths):
        f, problem = observe(run)
        (bad.append(f"{run}: {problem}") if problem else fields.append(f))
    if bad:
        raise PhiInputError(f"{len(bad)} run(s) cannot enter the fit:\n  " + "\n  ".join(bad))
    labels = budget_labels([f["flops"] for f in fields])
    obs = [Observation(run=f["run"], loss=f["loss"], tokens=f["tokens"], n_once=f["n_once"], n_rec=f["n_rec"],
                       r=f["r"], budget=label) for f, label in zip(fields, labels)]
    records = [{**f, "budget": label} for f, label in zip(fields, labels)]
    return obs, records
