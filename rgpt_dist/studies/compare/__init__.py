"""The runs of the CPU-scale Table 1 comparison (issue #14, `make compare`): every model of one
scaled-down cell on the same tokens, and a second seed of RecurrentGPT for the spread.

The cell keeps the paper's layouts (small isoFLOPs: the 12-layer dense model, 1+1x10+1 for every
recurrent family, discovered from the family specs) at a CPU width (launch.PRESETS); every run starts
from its grid config (configs/experiments/<flavour>-20k.yaml) with the same data, seed, batch and
steps. launcher/compare.py trains them; rgpt_dist.studies.compare.report reports them. No torch import.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rgpt_dist.models.flavours import FLAVOURS
from rgpt_dist.models.spec import families
from rgpt_dist.studies.launch import cpu_overrides

CELL = "small-isoflops"
SPREAD_FAMILY = "recurrent_gpt"
"""The model trained with a second seed: the run-to-run spread beside the differences."""
SEEDS = (1337, 42)


@dataclasses.dataclass(frozen=True)
class Run:
    flavour: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.flavour}-seed{self.seed}"

    @property
    def config(self) -> str:
        """Its grid config, relative to the checkout."""
        return f"configs/experiments/{self.flavour}-20k.yaml"

    @property
    def family(self) -> str:
        return FLAVOURS[self.flavour]["family"]


def cell_models(cell: str = CELL) -> list[str]:
    """The cell's dense baseline, then every family's flavour of the cell in Table 1's row order."""
    specs = sorted(families().values(), key=lambda s: s.table1_row)
    looped = [name for spec in specs for name in spec.paper_table1 if name.endswith(f"-{cell}")]
    dense = {ref for spec in specs for name, ref in spec.dense_reference.items() if name in looped}
    return sorted(dense) + looped


def plan(cell: str = CELL, seeds: tuple[int, ...] = SEEDS, every_seed: bool = False) -> list[Run]:
    """Every model once at seeds[0]; then the spread family's model at the other seeds, or with
    every_seed every model at every seed (the long study, issue #29)."""
    models = cell_models(cell)
    again = models if every_seed else [m for m in models if m in families()[SPREAD_FAMILY].paper_table1]
    return [Run(m, seeds[0]) for m in models] + [Run(m, s) for s in seeds[1:] for m in again]


def overrides(run: Run, preset: str, data: str, out: str | Path) -> list[str]:
    """The key=value overrides of one run on top of its grid config (same tokens for every run)."""
    return cpu_overrides(preset, run.family, run.seed, data, Path(out) / run.name)
