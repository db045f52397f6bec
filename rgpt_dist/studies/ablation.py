"""The runs of the CPU-scale sequential ablation (issue #15, `make ablation`): the rows of the paper's
Fig. 5 on the scaled-down small cell of `make compare` (d = 64, the same 100 steps of 16 x 128 tokens
for every row), with a second seed of the last row for the spread. Each run starts from its config in
configs/experiments/ (the ablation rows and the main grid's dense and full small runs);
launcher/ablation.py trains them, rgpt_dist.eval.ablation_table reports them. No torch import.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rgpt_dist.config import load_config
from rgpt_dist.config.ablations import ablations
from rgpt_dist.eval.ablation_table import DENSE_SMALL_RUN, SMALL_RUN
from rgpt_dist.studies.launch import ROOT, cpu_overrides

SPREAD_SEED = 42


@dataclasses.dataclass(frozen=True)
class AblationRun:
    name: str
    """The run directory's name: the ablation's or the main grid run's (what ablations.md reads)."""
    seed: int = 1337

    @property
    def config(self) -> str:
        """Its config, relative to the checkout."""
        base = f"ablation-b1-seed{self.seed}-recurrentgpt" if self.seed != 1337 else self.name
        return f"configs/experiments/{base}.yaml"

    @property
    def family(self) -> str:
        return load_config(ROOT / self.config).model.family


def plan() -> list[AblationRun]:
    """Fig. 5's rows in order (the dense baseline, recurrence alone ... the full model), then the full
    model at a second seed (named as B.1's run)."""
    rows = [AblationRun(name) for name in ablations() if name.startswith("ablation-fig5-")]
    return [AblationRun(DENSE_SMALL_RUN), *rows, AblationRun(SMALL_RUN),
            AblationRun(f"ablation-b1-seed{SPREAD_SEED}-recurrentgpt", SPREAD_SEED)]


def overrides(run: AblationRun, preset: str, data: str, out: str | Path) -> list[str]:
    return cpu_overrides(preset, run.family, run.seed, data, Path(out) / run.name)
