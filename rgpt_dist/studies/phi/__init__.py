"""The looped scaling law at CPU scale (`rgpt study phi`, `make phi`): an iso-depth sweep of
RecurrentGPT through the real trainer, fitted by `rgpt eval phi`. A pipeline check, not a measurement
of phi (docs/evaluation.md). The cluster sweep (SPEC section 10, 380 runs): phi/grid.py.

The layout keeps the paper's iso-depth rule at a sixth of its depth: 1 + r x (4 / r) + 1, six block
executions per token for every r in {1, 2, 4} (the paper: 2 + r x (16 / r) + 2, twenty). Widths 32, 48
and 64 (head_dim 16) at three compute budgets a factor 2 apart, every (r, width, budget) once: 27 runs
in 9 (budget, r) cells, enough for the law's 6 parameters. A run's steps are its budget divided by its
training FLOPs per step (rgpt_dist.flops.train_flops: 3 x Eq. 1 at r, the tied head included), so at one
budget the narrow models see more tokens; the steps are rounded, so achieved budgets differ from the
nominal ones by under 2 % (the reader groups runs within 10 %).

At this scale the 50,257-row head costs ~8x the six blocks and every run is still learning unigram and
bigram statistics, so the non-embedding N the law uses explains little of the loss: expect a wide
interval. One process per run, two runs side by side. No torch import.
"""
from __future__ import annotations

import sys
from pathlib import Path

from rgpt_dist.config import load_config
from rgpt_dist.eval.phi.analysis import analyse
from rgpt_dist.flops import train_flops
from rgpt_dist.safe_paths import out_dir, publish, staging
from rgpt_dist.sections import literal_override
from rgpt_dist.studies.base import Context, LanguageModelStudy, Run
from rgpt_dist.studies.launch import ROOT
from rgpt_dist.studies.phi import grid as sweep

BASE = "configs/experiments/quickstart.yaml"
"""The base config (RecurrentGPT, the embedded corpus's 128-token samples); every model field the
sweep sets is overridden, so only its recipe fields (optimizer, noise, gate) carry over."""
RECURRENCES = (1, 2, 4)
WIDTHS = {32: 2, 48: 3, 64: 4}  # d_model -> heads (head_dim 16)
CORE_BLOCKS = 4  # n_rec x r = 4: iso-depth
BUDGETS = (0.9e12, 1.8e12, 3.6e12)
"""Training FLOPs per run: about 40, 80 and 160 steps of 8 x 128 tokens at d = 64 (the head included)."""
SEQ_LEN, BATCH = 128, 8
SEED = 1337


def model_overrides(r: int, d_model: int) -> list[str]:
    return [f"model.d_model={d_model}", f"model.n_head={WIDTHS[d_model]}", "model.n_pre=1",
            "model.n_coda=1", f"model.n_rec={CORE_BLOCKS // r}", f"model.n_loops={r}",
            "model.r_min=1", "model.depth_sampler=fixed", f"model.block_size={SEQ_LEN}"]


def steps(r: int, d_model: int, budget: float) -> int:
    """The budget over the training FLOPs of one step, rounded (at least 10 steps)."""
    base = load_config(ROOT / BASE, model_overrides(r, d_model))
    per_step = train_flops(base.model, SEQ_LEN) * SEQ_LEN * BATCH
    return max(10, round(budget / per_step))


def run_of(r: int, d_model: int, budget: float) -> Run:
    """One run: its model and its whole recipe (one process, fp32, no ZeRO; warm-up a tenth of the
    steps, cosine to a tenth of the peak; one evaluation (16 batches of the validation split) and one
    checkpoint, at the last step)."""
    n = steps(r, d_model, budget)
    recipe = [f"train.seq_len={SEQ_LEN}", f"train.micro_batch_size={BATCH}", f"train.global_batch_size={BATCH}",
              f"train.max_steps={n}", f"train.warmup_steps={max(1, n // 10)}", "train.lr=2e-3", "train.min_lr=2e-4",
              f"train.seed={SEED}", "parallel.zero_stage=0", "parallel.dtype=fp32",
              "parallel.activation_checkpointing=none", f"checkpoint.every_steps={n}", "checkpoint.keep_last=1",
              f"eval.every_steps={n}", "eval.batches=16", "log.every_steps=10", "log.wandb=disabled"]
    return Run(name=f"phi-cpu-r{r}-d{d_model}-c{budget:.2g}", config=BASE, family="recurrent_gpt", seed=SEED,
               model=f"r{r} d{d_model}", overrides=(*model_overrides(r, d_model), *recipe))


def plan() -> list[Run]:
    """Largest budget first, so a run killed for time loses the cheap ones (they run last)."""
    return [run_of(r, d, c) for c in sorted(BUDGETS, reverse=True) for d in WIDTHS for r in RECURRENCES]


class Phi(LanguageModelStudy):
    name = "phi"
    summary = "the looped scaling law's iso-depth sweep at CPU scale (27 runs), and the fit of phi"
    reproduces = ("the sweep-and-fit pipeline with its interval; not a measurement of phi (recorded in results/phi; "
                  "docs/evaluation.md)")
    presets = ("cpu",)
    default_nproc, default_jobs = 1, 2
    record = "results/phi"

    def plan(self, preset: str) -> list[Run]:
        return plan()

    def overrides(self, run: Run, ctx: Context) -> list[str]:
        return [literal_override("data.paths", [str(ctx.data)]), literal_override("log.run_dir", str(Path(ctx.out) / run.name))]

    def report(self, ctx: Context, runs: list[Run]) -> dict[str, Path]:
        """`rgpt eval phi` over the runs into OUT/fit: phi.md, phi.json, phi.png; no fit while a run
        has not finished (the law needs every cell)."""
        unfinished = [run.name for run in runs if not (Path(ctx.out) / run.name / "metrics.jsonl").is_file()]
        if unfinished:
            print(f"phi: {len(unfinished)} run(s) not finished ({', '.join(unfinished)}); no fit", file=sys.stderr)
            return {}
        out = out_dir(Path(ctx.out) / "fit")  # written as `rgpt eval phi` writes: staged, then moved in
        out.mkdir(parents=True, exist_ok=True)
        with staging(out, ".rgpt-phi-partial-") as tmp:
            summary = analyse({"": [str(Path(ctx.out) / run.name) for run in runs]}, tmp,
                              restarts=ctx.options.get("restarts", 500), samples=ctx.options.get("bootstrap", 200))
            publish(tmp, out)
        print(summary)
        return {"md": out / "phi.md", "json": out / "phi.json", "png": out / "phi.png"}

    def grid(self, root: Path) -> list[Path]:
        return sweep.write_grid(root)


PHI = Phi()
