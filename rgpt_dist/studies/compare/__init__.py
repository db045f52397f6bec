"""The CPU-scale Table 1 comparison (`rgpt study compare`, `make compare`) and its long sibling
(`rgpt study compare-long`, `make compare-long`): every model of one scaled-down cell on the same
tokens, a second seed of RecurrentGPT for the spread (compare) or every model at both seeds at 10x
the tokens (compare-long, its finished runs kept in results/compare-long across machines).

The cell keeps the paper's layouts (small isoFLOPs: the 12-layer dense model, 1+1x10+1 for every
recurrent family, discovered from the family specs) at a CPU width (launch.PRESETS); every run starts
from its grid config (configs/experiments/<flavour>-20k.yaml, written by compare/grid.py, the paper's
whole grid) with the same data, seed, batch and steps. The report: compare/report.py. No torch import.
"""
from __future__ import annotations

from pathlib import Path

from rgpt_dist.models.flavours import FLAVOURS
from rgpt_dist.models.spec import families
from rgpt_dist.studies.base import Context, LanguageModelStudy, Run
from rgpt_dist.studies.compare import grid as paper_grid
from rgpt_dist.studies.compare import report as compare_report
from rgpt_dist.studies.launch import PRESETS, cpu_overrides

CELL = "small-isoflops"
SPREAD_FAMILY = compare_report.SPREAD_FAMILY
"""The model trained with a second seed: the run-to-run spread beside the differences."""
SEEDS = (1337, 42)


def cell_models(cell: str = CELL) -> list[str]:
    """The cell's dense baseline, then every family's flavour of the cell in Table 1's row order."""
    specs = sorted(families().values(), key=lambda s: s.table1_row)
    looped = [name for spec in specs for name in spec.paper_table1 if name.endswith(f"-{cell}")]
    dense = {ref for spec in specs for name, ref in spec.dense_reference.items() if name in looped}
    return sorted(dense) + looped


def _run(flavour: str, seed: int) -> Run:
    return Run(name=f"{flavour}-seed{seed}", config=f"configs/experiments/{flavour}-20k.yaml",
               family=FLAVOURS[flavour]["family"], seed=seed, model=flavour)


def plan(cell: str = CELL, seeds: tuple[int, ...] = SEEDS, every_seed: bool = False) -> list[Run]:
    """Every model once at seeds[0]; then the spread family's model at the other seeds, or with
    every_seed every model at every seed (compare-long)."""
    models = cell_models(cell)
    again = models if every_seed else [m for m in models if m in families()[SPREAD_FAMILY].paper_table1]
    return [_run(m, seeds[0]) for m in models] + [_run(m, s) for s in seeds[1:] for m in again]


def overrides(run: Run, preset: str, data: str, out: str | Path) -> list[str]:
    """The key=value overrides of one run on top of its grid config (same tokens for every run)."""
    return cpu_overrides(preset, run.family, run.seed, data, Path(out) / run.name)


class Compare(LanguageModelStudy):
    name = "compare"
    summary = "the six models of one scaled-down Table 1 cell, and the report (13-19 min on 2 cores)"
    reproduces = ("Table 1's small isoFLOPs cell at d = 64 and 100 steps: the pipeline and each model's loss, "
                  "not the paper's ordering (one seed but RecurrentGPT's; the spread is as large as most gaps)")
    presets = ("cpu", "long", "quick")
    record: str | None = "results/compare"

    def plan(self, preset: str) -> list[Run]:
        return plan(every_seed=bool(PRESETS[preset].get("every_seed")))

    def overrides(self, run: Run, ctx: Context) -> list[str]:
        return overrides(run, ctx.preset, ctx.data, ctx.out)

    def report(self, ctx: Context, runs: list[Run]) -> dict[str, Path]:
        return compare_report.report(ctx.out, runs)

    def grid(self, root: Path) -> list[Path]:
        return paper_grid.write_yaml(root / "configs" / "experiments")


class CompareLong(Compare):
    name = "compare-long"
    summary = "compare at 10x the tokens, d = 128, every model at two seeds (hours; resumes across machines)"
    reproduces = ("RecurrentGPT first at both seeds, as in the paper; RRT last where the paper has it second; the "
                  "middle three within their seeds' spread (results/compare-long, docs/evaluation.md)")
    presets = ("long", "quick")
    record = "results/compare-long"

    def plan(self, preset: str) -> list[Run]:
        return plan(every_seed=True)

    def grid(self, root: Path) -> list[Path]:
        return []  # compare's grid


COMPARE, COMPARE_LONG = Compare(), CompareLong()
