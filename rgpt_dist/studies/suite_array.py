"""The task suites' cluster arrays (slurm/algorithmic.sh, slurm/thinking.sh), written from their
studies' grids: `rgpt study algorithmic grid` and `rgpt study thinking grid` rewrite them, and a test
checks that the committed scripts are what this writes.

An array runs every study of its grid in order. A study is TASKS x MODELS x SEEDS with its OVERRIDES
(and a SUFFIX on its run directories' model part, where two studies share a task and a model);
slurm/studies.sh, which the script sources, maps an array id to its run: id - the study's offset =
(task * |MODELS| + model) * |SEEDS| + seed. One process per run, CPU threads only. No torch import.
"""
from __future__ import annotations

import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

from rgpt_dist.studies.base import write_text

WIDTH = 110
"""The scripts' line width."""


@dataclass(frozen=True)
class ArrayStudy:
    """One study of a suite's array: its runs are tasks x models x seeds, in that nesting."""

    name: str
    tasks: tuple[str, ...]
    models: tuple[str, ...]
    seeds: tuple[int, ...]
    overrides: tuple[str, ...] = ()
    suffix: str = ""
    about: str = ""
    """Its line in the script's table of studies (after the id range)."""

    @property
    def size(self) -> int:
        return len(self.tasks) * len(self.models) * len(self.seeds)


@dataclass(frozen=True)
class SuiteArray:
    """One suite's array script."""

    path: str
    """Where it lives in the checkout (slurm/algorithmic.sh)."""
    source: str
    """The module holding its grid (rgpt_dist/studies/algorithmic/grid.py)."""
    job_name: str
    intro: str
    """The opening comment: what the array runs, how to submit it, what it costs."""
    cli: str
    """The suite's program under launcher/ (algo.py)."""
    runs: str
    """The default run root under the checkout (runs/algorithmic)."""
    studies: tuple[ArrayStudy, ...]
    notes: str
    """Comment lines after the table of studies (steps, environment overrides)."""
    evaluations: tuple[str, ...]
    """The suite's evaluations of one trained run, as CLI arguments after the program, with "$1" the
    run directory: one tuple of words per command."""
    evaluations_about: str

    @property
    def size(self) -> int:
        return sum(s.size for s in self.studies)


def _comment(text: str) -> list[str]:
    """Each line of `text` as a comment line (a blank line as a bare '#')."""
    return [f"# {line}".rstrip() for line in textwrap.dedent(text).strip("\n").splitlines()]


def _array(name: str, words) -> list[str]:
    """`    NAME=(word ...)`, wrapped at WIDTH with its continuation under the first word."""
    head = f"    {name}=("
    lines = textwrap.wrap(" ".join(shlex.quote(str(w)) for w in words), WIDTH - len(head) - 1,
                          break_long_words=False, break_on_hyphens=False) or [""]
    return [head + lines[0] + (")" if len(lines) == 1 else "")] + [
        " " * len(head) + line + (")" if i == len(lines) - 1 else "") for i, line in enumerate(lines[1:], 1)]


def _ranges(array: SuiteArray) -> list[str]:
    """The table of studies: name, array ids, what it is."""
    out, offset, width = [], 0, max(len(s.name) for s in array.studies)
    for s in array.studies:
        span = f"{offset}-{offset + s.size - 1}"
        out.append(f"#   {s.name:<{width}}  {span:<8} {s.about}".rstrip())
        offset += s.size
    return out


def _lists(array: SuiteArray) -> list[str]:
    out = [f"STUDIES=({' '.join(s.name for s in array.studies)})",
           "# shellcheck disable=SC2034  # the study lists are read through namerefs (slurm/studies.sh)", "{"]
    for s in array.studies:
        p = s.name.upper()
        out += [*_array(f"{p}_TASKS", s.tasks), *_array(f"{p}_MODELS", s.models), *_array(f"{p}_SEEDS", s.seeds),
                *_array(f"{p}_OVERRIDES", s.overrides)]
        if s.suffix:
            out.append(f"    {p}_SUFFIX={shlex.quote(s.suffix)}")
    return out + ["}"]


def render(array: SuiteArray) -> str:
    """The whole script."""
    header = ["#!/bin/bash", *_comment(array.intro),
              f"#SBATCH --job-name={array.job_name}", f"#SBATCH --array=0-{array.size - 1}",
              "#SBATCH --nodes=1", "#SBATCH --ntasks=1", "#SBATCH --cpus-per-task=4", "#SBATCH --mem=8G",
              "#SBATCH --time=24:00:00", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@120",
              "#SBATCH --open-mode=append", "#SBATCH --output=logs/%x-%A_%a.out", "#",
              f"# Written by `rgpt study ... grid` from {array.source}: edit the grid there, not here.",
              "# The studies, in array order (slurm/studies.sh: id - offset = (task * |MODELS| + model) * |SEEDS|",
              "# + seed):", *_ranges(array), *_comment(array.notes)]
    evaluations = [f"evaluations() {{  # RUN_DIR: {array.evaluations_about}",
                   '    local run=(show); [[ "${RGPT_DRY_RUN:-0}" == 1 ]] || run=()',
                   *('    "${run[@]}" "${CLI[@]}" ' + " ".join(words) for words in array.evaluations), "}"]
    body = [*_lists(array),
            f"SUITE={array.path} SUITE_CLI={array.cli} SUITE_RUNS={array.runs}",
            "export OMP_NUM_THREADS=4  # the runs' threads (--cpus-per-task)", "",
            "show() { printf '%q ' \"$@\"; echo; }  # a command as the dry run prints it",
            "# shellcheck disable=SC2329  # called by studies.sh", *evaluations,
            "# shellcheck source-path=SCRIPTDIR source=studies.sh",
            'source "${RGPT_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}/slurm/studies.sh"']
    return "\n".join(header + body) + "\n"


def write(array: SuiteArray, root: Path) -> list[Path]:
    """root/<array.path>."""
    return [write_text(Path(root) / array.path, render(array))]
