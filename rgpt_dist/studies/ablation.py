"""The runs of the CPU-scale sequential ablation (issue #15, `make ablation`): the rows of the paper's
Fig. 5 on the scaled-down small cell of `make compare` (d = 64, the same 100 steps of 16 x 128 tokens
for every row), with a second seed of the last row for the spread. Each run starts from its config in
configs/experiments/ (the ablation rows and the main grid's dense and full small runs);
launcher/ablation.py trains them, `report` (the tables of rgpt_dist.eval.ablation_table) reports them.
No torch import.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rgpt_dist.config import load_config
from rgpt_dist.config.ablations import ablations
from rgpt_dist.eval.ablation_table import DENSE_SMALL_RUN, SMALL_RUN, markdown, study_rows
from rgpt_dist.eval.grid import summarize, write_table
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


def report(out_dir: str | Path) -> dict[str, Path]:
    """ablations.md (the Fig. 5 table with deltas, and the seeds), grid.{md,csv,json} and the bar
    chart ablation.png in out_dir, from the runs' own records."""
    out_dir = Path(out_dir)
    rows = summarize(out_dir, stale_after_s=None)
    paths = dict(zip(("grid_md", "grid_csv", "grid_json"), write_table(rows, out_dir)))
    md = markdown(rows) or "# Ablations\n\nNo ablation run has finished.\n"
    (out_dir / "ablations.md").write_text(md)
    plot(study_rows(rows, "fig5"), out_dir / "ablation.png")
    return {**paths, "md": out_dir / "ablations.md", "png": out_dir / "ablation.png"}


def plot(found: list[tuple[str, dict[str, Any]]], path: Path) -> None:
    """Fig. 5's bars: each row's validation loss, the dense baseline as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(label, r["val_loss"]) for label, r in found if not label.startswith("1-") and r["val_loss"] is not None]
    dense = next((r["val_loss"] for label, r in found if label.startswith("1-")), None)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([label for label, _ in bars], [v for _, v in bars], color="tab:blue")
    if dense is not None:
        ax.axhline(dense, color="grey", linestyle="--", label="dense baseline")
        ax.legend(fontsize=8)
    if bars:
        values = [v for _, v in bars] + ([dense] if dense is not None else [])
        ax.set_ylim(min(values) - 0.05, max(values) + 0.05)
    ax.set(ylabel="validation loss", title="sequential ablation, scaled-down small cell")
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
