"""The runs of `make phi` (issue #26): a CPU-scale iso-depth sweep of RecurrentGPT through the real
trainer, fitted by `rgpt-eval phi`. A pipeline check, not a measurement of phi (docs/evaluation.md).

The layout keeps the paper's iso-depth rule at a sixth of its depth: 1 + r x (4 / r) + 1, six block
executions per token for every r in {1, 2, 4} (the paper: 2 + r x (16 / r) + 2, twenty). Widths 32, 48
and 64 (head_dim 16) at three compute budgets a factor 2 apart, every (r, width, budget) once: 27 runs
in 9 (budget, r) cells, enough for the law's 6 parameters. A run's steps are its budget divided by its
training FLOPs per step (rgpt_dist.flops.train_flops: 3 x Eq. 1 at r, the tied head included), so at one
budget the narrow models see more tokens; the steps are rounded, so achieved budgets differ from the
nominal ones by under 2 % (the reader groups runs within 10 %).

At this scale the 50,257-row head costs ~8x the six blocks and every run is still learning unigram and
bigram statistics, so the non-embedding N the law uses explains little of the loss: expect a wide
interval. Launched one process per run, two runs side by side (launcher/phi.py). No torch import.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rgpt_dist.config import load_config
from rgpt_dist.flops import train_flops

BASE = "configs/experiments/quickstart.yaml"
"""The base config (RecurrentGPT, the embedded corpus's 128-token samples); every model field the
sweep sets is overridden, so only its recipe fields (optimizer, noise, gate) carry over."""
RECURRENCES = (1, 2, 4)
WIDTHS = {32: 2, 48: 3, 64: 4}  # d_model -> heads (head_dim 16)
CORE_BLOCKS = 4  # n_rec x r = 4: iso-depth
BUDGETS = (0.9e12, 1.8e12, 3.6e12)
"""Training FLOPs per run: about 25, 50 and 100 steps of 8 x 128 tokens at d = 64 (the head included)."""
SEQ_LEN, BATCH = 128, 8
SEED = 1337


@dataclasses.dataclass(frozen=True)
class Run:
    r: int
    d_model: int
    budget: float

    @property
    def name(self) -> str:
        return f"phi-cpu-r{self.r}-d{self.d_model}-c{self.budget:.2g}"

    @property
    def config(self) -> str:
        return BASE

    def model_overrides(self) -> list[str]:
        return [f"model.d_model={self.d_model}", f"model.n_head={WIDTHS[self.d_model]}", "model.n_pre=1",
                "model.n_coda=1", f"model.n_rec={CORE_BLOCKS // self.r}", f"model.n_loops={self.r}",
                "model.r_min=1", "model.depth_sampler=fixed", f"model.block_size={SEQ_LEN}"]

    def steps(self) -> int:
        """The budget over the training FLOPs of one step, rounded (at least 10 steps)."""
        base = load_config(Path(__file__).resolve().parents[2] / BASE, self.model_overrides())
        per_step = train_flops(base.model, SEQ_LEN) * SEQ_LEN * BATCH
        return max(10, round(self.budget / per_step))


def plan() -> list[Run]:
    """Largest budget first, so a run killed for time loses the cheap ones (they run last)."""
    return [Run(r, d, c) for c in sorted(BUDGETS, reverse=True) for d in WIDTHS for r in RECURRENCES]


def overrides(run: Run, data: str, out: str | Path) -> list[str]:
    """One process, fp32, no ZeRO; warm-up a tenth of the steps, cosine to a tenth of the peak; one
    evaluation (16 batches of the validation split) and one checkpoint, at the last step."""
    steps = run.steps()
    return [*run.model_overrides(), f"train.seq_len={SEQ_LEN}", f"train.micro_batch_size={BATCH}",
            f"train.global_batch_size={BATCH}", f"train.max_steps={steps}", f"train.warmup_steps={max(1, steps // 10)}",
            "train.lr=2e-3", "train.min_lr=2e-4", f"train.seed={SEED}", f"data.paths=[{data}]",
            "parallel.zero_stage=0", "parallel.dtype=fp32", "parallel.activation_checkpointing=none",
            f"checkpoint.every_steps={steps}", "checkpoint.keep_last=1", f"eval.every_steps={steps}",
            "eval.batches=16", f"log.run_dir={Path(out) / run.name}", "log.every_steps=10", "log.wandb=disabled"]
