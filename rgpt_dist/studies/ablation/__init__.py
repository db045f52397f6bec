"""The CPU-scale sequential ablation (`rgpt study ablation`, `make ablation`): the rows of the paper's
Fig. 5 on the scaled-down small cell of `compare` (d = 64, the same 100 steps of 16 x 128 tokens for
every row), with a second seed of the last row for the spread. Each run starts from its config in
configs/experiments/ (the ablation rows, written by ablation/grid.py with the paper's other ablations
and sweeps, and the main grid's dense and full small runs); ablation/report.py reports them (the
tables: ablation/table.py). No torch import.
"""
from __future__ import annotations

from pathlib import Path

from rgpt_dist.config import load_config
from rgpt_dist.studies.ablation import report as ablation_report
from rgpt_dist.studies.ablation.grid import ablations, write_grid
from rgpt_dist.studies.ablation.table import DENSE_SMALL_RUN, SMALL_RUN
from rgpt_dist.studies.base import Context, LanguageModelStudy, Run
from rgpt_dist.studies.launch import ROOT, cpu_overrides

SPREAD_SEED = 42


def _run(name: str, seed: int = 1337) -> Run:
    """A row: the run directory's name is the ablation's or the main grid run's (what ablations.md
    reads); a second seed starts from B.1's config of that seed."""
    base = f"ablation-b1-seed{seed}-recurrentgpt" if seed != 1337 else name
    config = f"configs/experiments/{base}.yaml"
    model = load_config(ROOT / config).model
    return Run(name=name, config=config, family=model.family, seed=seed, model=name)


def plan() -> list[Run]:
    """Fig. 5's rows in order (the dense baseline, recurrence alone ... the full model), then the full
    model at a second seed (named as B.1's run)."""
    rows = [_run(name) for name in ablations() if name.startswith("ablation-fig5-")]
    return [_run(DENSE_SMALL_RUN), *rows, _run(SMALL_RUN),
            _run(f"ablation-b1-seed{SPREAD_SEED}-recurrentgpt", SPREAD_SEED)]


def overrides(run: Run, preset: str, data: str, out: str | Path) -> list[str]:
    return cpu_overrides(preset, run.family, run.seed, data, Path(out) / run.name)


class Ablation(LanguageModelStudy):
    name = "ablation"
    summary = "the paper's sequential component ablation (Fig. 5) at CPU scale (10-13 min on 2 cores)"
    reproduces = "Fig. 5's rows through the real trainer at d = 64: the pipeline, not the paper's deltas"
    record = "results/ablation"

    def plan(self, preset: str) -> list[Run]:
        return plan()

    def overrides(self, run: Run, ctx: Context) -> list[str]:
        return overrides(run, ctx.preset, ctx.data, ctx.out)

    def report(self, ctx: Context, runs: list[Run]) -> dict[str, Path]:
        return ablation_report.report(ctx.out)

    def grid(self, root: Path) -> list[Path]:
        return write_grid(root)


ABLATION = Ablation()
