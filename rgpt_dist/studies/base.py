"""What every study shares: one `Run` type, the `Study` protocol `rgpt study NAME run|report|grid`
drives, and the paper recipe and config writer the cluster grids build on. No torch import.

A study is to `rgpt study` what a FamilySpec is to the trainer: the runner (studies/runner.py) knows
nothing of any one study, and a study knows nothing of how its runs are scheduled.

    plan(preset)               -> [Run]      which runs, in training order
    commands(run, ctx)         -> [[argv]]   what trains (and evaluates) one run, in sequence
    report(ctx, runs)          -> {name: path} the tables and plots from the runs' own records
    grid(root)                 -> [path]     the cluster grid: its configs/experiments/ and slurm/ files
"""
from __future__ import annotations

import dataclasses
import fnmatch
import sys
from pathlib import Path
from typing import Any, Protocol

import yaml

from rgpt_dist.config import load_config
from rgpt_dist.flops import train_flops
from rgpt_dist.studies.launch import ROOT, train_command


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a study: trained from `config` with the study's overrides into OUT/<name>."""

    name: str
    """The run directory's name under the study's output directory (and its record's)."""
    config: str
    """The config it starts from, relative to the checkout."""
    family: str
    """Its model family, from the flavour's spec (FLAVOURS[flavour]["family"] or the loaded config)."""
    seed: int
    model: str = ""
    """The model as the report names it (a flavour, or a label such as 'RT 2x90')."""
    overrides: tuple[str, ...] = ()
    """key=value overrides of the study's own, applied after the preset's."""


@dataclasses.dataclass(frozen=True)
class Context:
    """Where and how a study runs: what `rgpt study NAME run` was given."""

    out: Path
    """The study's directory: one run directory each, the report beside them."""
    data: str | None = None
    """The rgpt-prep dataset (language-model studies); None for the generated tasks."""
    preset: str = "cpu"
    nproc: int = 2
    """Processes per run."""
    jobs: int = 1
    """Runs trained side by side."""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """A study's own options (phi: restarts, bootstrap)."""


class Study(Protocol):
    name: str
    summary: str
    """One line for `rgpt study --help`."""
    reproduces: str
    """What it reproduces and how strongly, for README and `rgpt study NAME --help`."""
    needs_data: bool
    presets: tuple[str, ...]
    default_nproc: int
    default_jobs: int
    record: str | None
    """results/<dir> where finished runs are kept and reused across machines (compare-long), or None."""

    def plan(self, preset: str) -> list[Run]: ...

    def commands(self, run: Run, ctx: Context) -> list[list[str]]: ...

    def report(self, ctx: Context, runs: list[Run]) -> dict[str, Path]: ...

    def grid(self, root: Path) -> list[Path]: ...

    def record_files(self, run: Run) -> tuple[str, ...]: ...


def chosen(runs: list[Run], only: str | None) -> list[Run]:
    """The runs matching any of `only`'s comma-separated fnmatch patterns (all when None);
    ValueError names a pattern that matches no run."""
    if only is None:
        return runs
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(r.name, p) for r in runs)]
    if unmatched or not patterns:
        raise ValueError(f"--only {only!r}: {unmatched or 'no pattern'} matches none of {[r.name for r in runs]}")
    return [r for r in runs if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def python_command(module: str, *args: str) -> list[str]:
    """This interpreter running `module` (never a script path: the checkout is on PYTHONPATH)."""
    return [sys.executable, "-m", module, *args]


# ---- the paper recipe and the config files of the cluster grids ----

MICRO_BATCH = 6


def run_config(name: str, model: str | dict[str, Any], steps: int, **train: Any) -> dict[str, Any]:
    """One cluster run of the paper's recipe (TrainConfig's defaults) for `model` (a flavour, or a
    model section naming its flavour) over `steps` optimizer steps; `train` adds train fields."""
    every = min(1000, steps // 4)
    return {
        "model": model,
        # micro-batch 6 divides the 480-sequence batch on 8 or 16 GPUs (accumulation 10 or 5)
        "train": {"max_steps": steps, "micro_batch_size": MICRO_BATCH, **train},
        "data": {"paths": ["data/pretrain"]},
        "parallel": {"zero_stage": 2, "dtype": "bf16", "activation_checkpointing": "recurrence"},
        "checkpoint": {"every_steps": every, "keep_last": 3},
        "eval": {"every_steps": every, "batches": 20},
        "log": {"run_dir": f"runs/{name}", "every_steps": 10},
    }


def write_configs(directory: str | Path, configs: dict[str, dict[str, Any]], header) -> list[Path]:
    """Each config as directory/<name>.yaml under the comment header(name); returns the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in configs.items():
        path = directory / f"{name}.yaml"
        path.write_text(header(name) + yaml.safe_dump(data, sort_keys=False))
        written.append(path)
    return written


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


class LanguageModelStudy:
    """Defaults for the studies that train language models on an rgpt-prep dataset through the
    training launcher: one torchrun per run, the runs' own config.yaml and metrics.jsonl recorded."""

    needs_data = True
    presets: tuple[str, ...] = ("cpu", "quick")
    default_nproc, default_jobs = 2, 1
    record: str | None = None

    def overrides(self, run: Run, ctx: Context) -> list[str]:
        raise NotImplementedError

    def commands(self, run: Run, ctx: Context) -> list[list[str]]:
        return [train_command(run.config, [*self.overrides(run, ctx), *run.overrides], ctx.nproc)]

    def cost(self, run: Run, ctx: Context) -> float:
        """Training FLOPs per token of the run as configured: recorded studies train cheapest first."""
        cfg = load_config(ROOT / run.config, [*self.overrides(run, ctx), *run.overrides])
        return train_flops(cfg.model, cfg.train.seq_len)

    def grid(self, root: Path) -> list[Path]:
        return []

    def record_files(self, run: Run) -> tuple[str, ...]:
        return ("config.yaml", "metrics.jsonl")
