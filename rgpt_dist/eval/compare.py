"""A CPU-scale Table 1 comparison (issue #14): every model of one scaled-down cell trained on the same
tokens, then the grid table, the early-exit curves in one plot, and the spread of two seeds.

The cell keeps the paper's layouts (small isoFLOPs: the 12-layer dense model, 1+1x10+1 for every
recurrent family, discovered from the family specs) at a CPU width (`PRESETS`); every run starts from
its grid config (configs/experiments/<flavour>-20k.yaml) with the same data, seed, batch and steps.
`plan` lists the runs, launcher/compare.py trains them, `report` writes OUT/compare.md (+ .json),
OUT/grid.{md,csv,json} (rgpt_dist.eval.grid) and OUT/early_exit.png. No torch import.
"""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

from rgpt_dist.config.flavours import FLAVOURS
from rgpt_dist.eval import strict_json
from rgpt_dist.eval.grid import summarize, write_table
from rgpt_dist.eval.markdown import cell, code
from rgpt_dist.models.spec import families, spec_for

CELL = "small-isoflops"
SPREAD_FAMILY = "recurrent_gpt"
"""The model trained with a second seed: the run-to-run spread beside the differences."""
SEEDS = (1337, 42)
PRESETS: dict[str, dict[str, Any]] = {
    # about 13 min on 2 cores (2026-12-01: 11 min 24 s for five models, MoR 86 s), half of it Ouro's ten
    # readouts through the 50,257-row head
    "cpu": {"d_model": 64, "n_head": 4, "seq_len": 128, "micro_batch_size": 8, "global_batch_size": 16,
            "max_steps": 100, "warmup_steps": 10, "lr": 2e-3, "min_lr": 2e-4, "eval_batches": 4},
    # a smoke run of the whole flow (tests)
    "quick": {"d_model": 32, "n_head": 2, "seq_len": 32, "micro_batch_size": 2, "global_batch_size": 4,
              "max_steps": 2, "warmup_steps": 1, "lr": 2e-3, "min_lr": 2e-4, "eval_batches": 1},
}


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


def plan(cell: str = CELL, seeds: tuple[int, ...] = SEEDS) -> list[Run]:
    """Every model once at seeds[0]; the spread family's model at every seed."""
    models = cell_models(cell)
    spread = [m for m in models if m in families()[SPREAD_FAMILY].paper_table1]
    return [Run(m, seeds[0]) for m in models] + [Run(m, s) for m in spread for s in seeds[1:]]


def overrides(run: Run, preset: str, data: str, out: str | Path) -> list[str]:
    """The key=value overrides of one run on top of its grid config (same tokens for every run)."""
    return cpu_overrides(preset, run.family, run.seed, data, Path(out) / run.name)


def cpu_overrides(preset: str, family: str, seed: int, data: str, run_dir: str | Path) -> list[str]:
    """A grid config shrunk to a CPU preset: width, batch, steps, schedule, 2-process ZeRO-2 in fp32,
    one checkpoint and one evaluation at the end; RRT's LoRA rank keeps its ratio to the width."""
    p = PRESETS[preset]
    spec = spec_for(family)
    width = [f"model.{k}={v}" for k, v in spec.width_overrides(p["d_model"]).items()]  # RRT's LoRA rank
    return [*width, f"model.d_model={p['d_model']}", f"model.n_head={p['n_head']}", f"model.block_size={p['seq_len']}",
            f"train.seq_len={p['seq_len']}", f"train.micro_batch_size={p['micro_batch_size']}",
            f"train.global_batch_size={p['global_batch_size']}", f"train.max_steps={p['max_steps']}",
            f"train.warmup_steps={p['warmup_steps']}", f"train.lr={p['lr']}", f"train.min_lr={p['min_lr']}",
            f"train.seed={seed}", f"data.paths=[{data}]", "parallel.zero_stage=2", "parallel.dtype=fp32",
            "parallel.activation_checkpointing=none", f"checkpoint.every_steps={p['max_steps']}",
            "checkpoint.keep_last=1", f"eval.every_steps={p['max_steps']}", f"eval.batches={p['eval_batches']}",
            f"log.run_dir={run_dir}", "log.every_steps=10", "log.wandb=disabled"]


def train_runs(runs: list, args_of, root: Path, nproc: int = 2) -> list[str]:
    """Trains each run (`.name`, `.config` relative to root) with torchrun on nproc processes and the
    overrides args_of(run); prints one line per run; returns the names of those that failed (the
    others still run). A finished run is kept, an interrupted one resumes (the trainer's own rules)."""
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(root), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    failed = []
    for run in runs:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(root / "launcher" / "train.py"), str(root / run.config), *args_of(run)]
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        status = "done" if done.returncode == 0 else f"FAILED ({done.returncode})"
        print(f"{run.name}: {status} in {time.perf_counter() - start:.0f} s", flush=True)
        if done.returncode != 0:
            failed.append(run.name)
            print(done.stderr[-3000:], file=sys.stderr)
    return failed


def report(out_dir: str | Path, runs: list[Run]) -> dict[str, Path]:
    """compare.md and compare.json (one row per run, the seed spread), grid.{md,csv,json} and
    early_exit.png in out_dir, from the runs' own records."""
    out_dir = Path(out_dir)
    rows = {r["name"]: r for r in summarize(out_dir, stale_after_s=None)}
    table = [rows[run.name] for run in runs if run.name in rows]
    paths = dict(zip(("grid_md", "grid_csv", "grid_json"), write_table(table, out_dir)))
    spread = seed_spread(table)
    (out_dir / "compare.json").write_text(strict_json.dumps({"runs": table, "seed_spread": spread}, indent=1) + "\n")
    (out_dir / "compare.md").write_text(markdown(table, spread))
    plot_early_exit(table, out_dir / "early_exit.png")
    return {**paths, "md": out_dir / "compare.md", "json": out_dir / "compare.json", "png": out_dir / "early_exit.png"}


def seed_spread(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Validation losses of the spread model's seeds: each, their mean and max - min."""
    losses = {r["name"]: r["val_loss"] for r in rows if r["family"] == SPREAD_FAMILY and r["val_loss"] is not None}
    if len(losses) < 2:
        return None
    values = list(losses.values())
    return {"runs": losses, "mean": statistics.fmean(values), "range": max(values) - min(values)}


def markdown(rows: list[dict[str, Any]], spread: dict[str, Any] | None) -> str:
    head = ("| method | run | layout | params | train GFLOPs/token | tokens | val loss (R) | vs dense | "
            "early exit (r = 0..R) | status |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        delta = "" if r["delta_vs_dense"] is None else f"{r['delta_vs_dense']:+.4f}"
        loss = "" if r["val_loss"] is None else f"{r['val_loss']:.4f}"
        gflops = "" if r["train_flops_per_token"] is None else f"{r['train_flops_per_token'] / 1e9:.4f}"
        lines.append(f"| {cell(r['method'])} | {code(r['name'])} | {cell(r['layout'])} | "
                     f"{(r['params'] or 0) / 1e6:.2f}M | {gflops} | {r['tokens_seen'] or 0:,} | {loss} | {delta} | "
                     f"{cell(r['early_exit_str'] or '')} | {cell(r['status'])} |")
    text = head + "\n".join(lines) + "\n"
    if spread:
        seeds = ", ".join(f"{code(name)} {loss:.4f}" for name, loss in spread["runs"].items())
        text += (f"\nSeed spread ({SPREAD_FAMILY}): {seeds}; mean {spread['mean']:.4f}, max - min "
                 f"{spread['range']:.4f}. Differences between methods smaller than this are within "
                 f"run-to-run noise.\n")
    return text


def plot_early_exit(rows: list[dict[str, Any]], path: Path) -> None:
    """Validation loss at every exit depth of each depth-recurrent run, the dense run as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        if r["early_exit"]:
            ax.plot(range(len(r["early_exit"])), r["early_exit"], "o-", label=f"{r['method']} ({r['name']})")
        elif r["setting"] == "dense" and r["val_loss"] is not None:
            ax.axhline(r["val_loss"], color="grey", linestyle="--", label=f"{r['method']} ({r['name']})")
    ax.set(xlabel="exit depth r (0 = prelude into coda)", ylabel="validation loss",
           title="early exit, scaled-down small isoFLOPs cell")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
