"""The paper's experiment grid (SPEC sections 2-3) as experiment configs.

Every model of Table 1 that a registered family trains (the flavours in its spec's `paper_table1`:
the dense baselines, RecurrentGPT and the competitors, isoFLOPs and isoParams) at the standard
(20,000 steps) and doubled (40,000 steps) budget, with the paper's recipe (the defaults of
TrainConfig). `rgpt study compare grid` (and `make configs`) writes them to configs/experiments/; a test checks
the files agree. The compare study trains its small isoFLOPs cell at CPU scale.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rgpt_dist.sections import from_dict
from rgpt_dist.models.flavours import DENSE_REFERENCE, flavour
from rgpt_dist.models.config import ModelConfig
from rgpt_dist.config.train import TrainConfig
from rgpt_dist.flops import COMPUTE_TOLERANCE, train_flops
from rgpt_dist.models.spec import families
from rgpt_dist.studies.base import MICRO_BATCH, run_config, write_configs

BUDGETS = {"20k": 20000, "40k": 40000}
FLOP_MATCHED = "flopmatched"
"""The name part of a run trained at its cell's dense training compute (<cell>-flopmatched-<budget>)."""


def trained_flavours() -> list[str]:
    """Every flavour a family trains in Table 1, family by family (in discovery order)."""
    return [name for spec in families().values() for name in spec.paper_table1]


def flop_matched_steps(cell: str, steps: int) -> int:
    """The steps at which `cell` (a flavour) spends the training FLOPs its dense reference spends in
    `steps` at the same batch: steps x train_flops(dense) / train_flops(cell) at the grid's sequence
    length (training at E[r], what training adds included), rounded."""
    seq_len = TrainConfig.seq_len
    model, dense = (from_dict(ModelConfig, flavour(n)) for n in (cell, DENSE_REFERENCE[cell]))
    return round(steps * train_flops(dense, seq_len) / train_flops(model, seq_len))


def flop_matched_cells() -> list[str]:
    """The Table 1 flavours of every family whose spec offers a compute-matched run (compute_matching)
    and that trains more than 5 % below its dense model's FLOPs per token: MoR's three isoFLOPs cells
    (in the isoParams cells MoR spends more than its dense model, as that regime intends)."""
    return [name for spec in families().values() if spec.compute_matching == "tokens" for name in spec.paper_table1
            if flop_matched_steps(name, 100_000) > 100_000 * (1 + COMPUTE_TOLERANCE)]


def grid() -> dict[str, dict[str, Any]]:
    """Experiment name -> config mapping (model flavour + the sections that differ from defaults): every
    Table 1 cell at both budgets, then the compute-matched runs (<cell>-flopmatched-<budget>: the paper's
    layout on more tokens, until its training FLOPs equal the cell's dense model's)."""
    out = {f"{cell}-{budget}": run_config(f"{cell}-{budget}", cell, steps)
           for cell in trained_flavours() for budget, steps in BUDGETS.items()}
    for cell in flop_matched_cells():
        for budget, steps in BUDGETS.items():
            name = f"{cell}-{FLOP_MATCHED}-{budget}"
            out[name] = run_config(name, cell, flop_matched_steps(cell, steps))
    return out


def _matched_note(name: str) -> str:
    if f"-{FLOP_MATCHED}-" not in name:
        return ""
    cell, budget = name.split(f"-{FLOP_MATCHED}-")
    return (f"# At its dense model's training FLOPs: {flop_matched_steps(cell, BUDGETS[budget]):,} steps instead of "
            f"{BUDGETS[budget]:,} (flop_matched_steps; MoR's own comparison, on more tokens).\n")


def write_yaml(directory: str | Path) -> list[Path]:
    return write_configs(directory, grid(), lambda name: (
        f"# Paper grid cell {name}: generated from rgpt_dist/studies/compare/grid.py (`rgpt study compare grid`).\n"
        f"{_matched_note(name)}"
        f"# Prepare data/pretrain with rgpt-prep --seq-len 1024; tokens/step = 480 x 1024 on any GPU\n"
        f"# count: micro-batch {MICRO_BATCH} fits 8 or 16 GPUs; otherwise pick train.micro_batch_size so\n"
        f"# that 480 divides by micro x GPUs (checked before launch).\n"))
