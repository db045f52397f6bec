"""The paper's ablations and sensitivity sweeps as experiment configs (issue #15), beside the main
grid of rgpt_dist.studies.compare.grid. `rgpt study ablation grid` writes them to configs/experiments/ablation-*.yaml;
slurm/ablations.sh runs them as one array (its task table is `ABLATIONS`' order).

    fig5    the sequential component ablation, small cell, 20k steps (section 5, Fig. 5)
    table7  the same on the medium cell at 2k steps (Appendix B.2, Table 7)
    b4      gate temperature tau in {0.5, 1, 2}, medium, 5k steps (Appendix B.4)
    b5      state noise sigma_x in {0, 0.05, 0.1, 0.2}, medium, 5k steps (Appendix B.5)
    b6      gate bias {0, -2} and sigma_x {0, 0.2} at the full horizon, small, 20k (Appendix B.6)
    b1      seeds 42 and 123 of the small RecurrentGPT and its dense model, 20k (Appendix B.1)
    b6-gate the silent-thinking paper's stability ingredients (issue #28) as a pair, small, 20k:
            `gate-recurrentgpt` the paper's gate (bias +4, no LayerScale: the defaults, written out)
            vs `gate-thinking` (gate bias +2 = the thinking gate's b_z = -2, LayerScale 1e-4)

Rows the main grid already trains are not repeated: Fig. 5's dense baseline and full model are
gpt2-small-20k and recurrentgpt-small-isoflops-20k, and the defaults of B.1 and B.6 (seed 1337,
gate bias +4, sigma_x 0.1) are recurrentgpt-small-isoflops-20k (`REUSED` names them). Short
horizons warm up for 10% of their steps, as the 20k recipe does (2,000 steps).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rgpt_dist.studies.base import run_config, write_configs

SMALL, MEDIUM = "recurrentgpt-small-isoflops", "recurrentgpt-medium-isoflops"
# Fig. 5's rows on a cell's layout: each adds one component to the row before it. "Recurrence alone"
# shares the whole stack: one core looped over every block execution (small: 0+1x12+0; medium:
# 0+6x4+0, 24 executions at the cell's depth R = 4, our choice: the paper does not give it).
ALONE = {SMALL: {"n_pre": 0, "n_coda": 0, "n_rec": 1, "n_loops": 12},
         MEDIUM: {"n_pre": 0, "n_coda": 0, "n_rec": 6, "n_loops": 4}}
PLAIN = {"injection": "none", "gate": "none"}
ROWS = {
    "2-recurrence": lambda cell: {**ALONE[cell], **PLAIN, "sigma_x": 0.0},
    "3-prelude-coda": lambda cell: {**PLAIN, "sigma_x": 0.0},
    "4-state-noise": lambda cell: dict(PLAIN),
    "4b-noise-at-init": lambda cell: {**PLAIN, "state_noise": "init"},
    "5-reinjection": lambda cell: {"gate": "none"},
    "6-gate": lambda cell: {},
}
REUSED = {"ablation-fig5-1-dense": "gpt2-small-20k", "ablation-fig5-6-gate": f"{SMALL}-20k",
          "ablation-b6-default": f"{SMALL}-20k", "ablation-b1-seed1337": f"{SMALL}-20k and gpt2-small-20k",
          "ablation-b6-gate-recurrentgpt": f"{SMALL}-20k"}

# issue #28: the silent-thinking paper's two stability ingredients on the small cell; its partner, the
# paper's gate (+4) without LayerScale, is the main grid's recurrentgpt-small-isoflops-20k (REUSED)
THINKING_PAIR = {"gate-thinking": {"gate_bias_init": 2.0, "layerscale": 1e-4}}


def _model(cell: str, **fields: Any) -> dict[str, Any]:
    return {"flavour": cell, **fields}


def _short(steps: int) -> dict[str, Any]:
    return {"warmup_steps": steps // 10}


def ablations() -> dict[str, dict[str, Any]]:
    """Experiment name -> config mapping, in slurm/ablations.sh's task order."""
    runs: dict[str, tuple[Any, int, dict[str, Any]]] = {}
    for row, fields in ROWS.items():
        if f"ablation-fig5-{row}" not in REUSED:
            runs[f"ablation-fig5-{row}"] = (_model(SMALL, **fields(SMALL)), 20000, {})
    runs["ablation-table7-1-dense"] = ("gpt2-medium", 2000, _short(2000))
    for row, fields in ROWS.items():
        runs[f"ablation-table7-{row}"] = (_model(MEDIUM, **fields(MEDIUM)), 2000, _short(2000))
    for tau in (0.5, 1.0, 2.0):
        runs[f"ablation-b4-tau{tau:g}"] = (_model(MEDIUM, tau=tau), 5000, _short(5000))
    for sigma in (0.0, 0.05, 0.2):  # sigma_x = 0.1 at tau = 1 is ablation-b4-tau1
        runs[f"ablation-b5-sigma{sigma:g}"] = (_model(MEDIUM, sigma_x=sigma), 5000, _short(5000))
    for bias in (0.0, -2.0):
        runs[f"ablation-b6-gatebias{bias:g}"] = (_model(SMALL, gate_bias_init=bias), 20000, {})
    for sigma in (0.0, 0.2):
        runs[f"ablation-b6-sigma{sigma:g}"] = (_model(SMALL, sigma_x=sigma), 20000, {})
    for seed in (42, 123):
        runs[f"ablation-b1-seed{seed}-recurrentgpt"] = (SMALL, 20000, {"seed": seed})
        runs[f"ablation-b1-seed{seed}-dense"] = ("gpt2-small", 20000, {"seed": seed})
    for name, fields in THINKING_PAIR.items():  # appended last: the array's task ids keep their meaning
        runs[f"ablation-b6-{name}"] = (_model(SMALL, **fields), 20000, {})
    return {name: run_config(name, model, steps, **train) for name, (model, steps, train) in runs.items()}


def write_yaml(directory: str | Path) -> list[Path]:
    return write_configs(directory, ablations(), lambda name: (
        f"# Ablation run {name}: generated from rgpt_dist/studies/ablation/grid.py (`rgpt study ablation grid`).\n"
        "# Prepare data/pretrain with rgpt-prep --seq-len 1024; the main grid's recipe.\n"))


def write_grid(root: Path) -> list[Path]:
    """The ablation configs in root/configs/experiments (slurm/ablations.sh reads them by name in
    `ablations()`' order)."""
    return write_yaml(root / "configs" / "experiments")
