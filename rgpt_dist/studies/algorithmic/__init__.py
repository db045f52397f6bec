"""The RLT paper's length-generalisation protocol at CPU scale: `rgpt study rlt` (`make rlt`, the
headline: parity trained from 3-16 bits, tested to 256; swaps-S5 from 1-8 operations, tested to 512)
and `rgpt study algorithmic` (`make algorithmic`: parity and swaps-S5 with the Transformer baseline).
Each run trains (`rgpt algo train`, one process), its checkpoint is evaluated over the task's test
grid (`rgpt algo eval`), and `rgpt algo table` writes OUT/table/{table.md,table.json,
accuracy_vs_length.png}. The cluster grid in the paper's recipe: slurm/algorithmic.sh, written from
grid.py (docs/algorithmic.md). Its report imports torch (through the algorithmic evaluation the table
command shares).

Reductions from the paper's recipe (configs/algorithmic/*.yaml), shared by both:
- The models at width 128, 4 layers, FFN 341 (the paper: 512, 8, 1,365); fp32, AdamW 0.9/0.95, weight
  decay 0.1, clip 1 and the per-example loss unchanged.
- `algorithmic`: 400 steps of 64 examples (25,600 per run; the paper 1,024,000), warm-up 40, peak lr
  1e-3 to 5e-5 (20:1 as the paper; a short run needs the larger step), validation and checkpoints every
  50 steps, the minimum-validation-loss checkpoint scored on the first 256 of the 1,024 test sequences
  at each length of the grid (256 is the whole validation set).
- `rlt`: RLT-1 2+2, RLT-0 2+2 and the Transformer (4 layers), seeds 42, 43 and 44, 900 steps of 256
  examples (230,400; the paper 2,000 of 512), parity from 3-16 bits to the paper's 3-40 by a length
  curriculum (+8 bits after 100 steps in a row below a training loss of 0.01; growing after 10
  collapsed seed 44 at the lr it then had, docs/families.md). Every model runs muP at m = 1
  (mup_base_width = its width), as the paper's width-512 models do: the debug flavours' m = 1/4
  multiplies the hidden lr by 4, and RLT-1 then never leaves ln 2. The last checkpoint is scored (a
  run reaches the validation lengths, 32-40 bits, late or never). 450 steps were too few: RLT-1 first
  fits 3-16 bits (a sudden drop of the loss between steps 250 and 450, depending on the seed) and
  extrapolates only 100-200 steps later. Swaps-S5, the same models and seeds: 600 steps of 256, words
  of 1-8 operations first, +8 after 10 steps in a row below 0.05, up to the paper's fixed 32 (in a probe
  trained on 32 from the start, RLT-1 tracked 8.6 % of final states at 32 after 600 steps; docs/families.md).
  Width 128 stays: at width 64 RLT-1 trains twice as fast in tokens/s but needed more steps than that
  saves on both tasks (docs/families.md, "Time").
"""
from __future__ import annotations

from pathlib import Path

from rgpt_dist.algorithmic import cli as algo_cli
from rgpt_dist.models.flavours import FLAVOURS
from rgpt_dist.studies import suite_array
from rgpt_dist.studies.base import Context, Run, python_command
from rgpt_dist.studies.algorithmic import grid

SCHEDULE = ("train.warmup_steps=40", "train.lr=1e-3", "train.min_lr=5e-5", "log.wandb=disabled")
ALGO_RECIPE = ("train.max_steps=400", "train.global_batch_size=64", "train.micro_batch_size=32", *SCHEDULE,
               "eval.every_steps=50", "checkpoint.every_steps=50")
RLT_RECIPE = ("data.task_train_max=16", "data.task_grow_by=8", "data.task_grow_steps=100", "train.max_steps=900", "train.global_batch_size=256",
              "train.micro_batch_size=256", *SCHEDULE, "eval.every_steps=900", "checkpoint.every_steps=900",
              "checkpoint.keep_best=false", "model.mup_base_width=128")
S5_RECIPE = ("data.task_train_max=8", "data.task_grow_by=8", "data.task_grow_steps=10", "data.task_grow_loss=0.05",
             "train.max_steps=600", "train.global_batch_size=256", "train.micro_batch_size=256", *SCHEDULE,
             "eval.every_steps=600", "checkpoint.every_steps=600", "checkpoint.keep_best=false",
             "model.mup_base_width=128")
LIMIT = 256
"""Test sequences scored per length: the first 256 of 1,024."""
RLT_SEEDS = (42, 43, 44)
RLT_MODELS = {  # run label -> (flavour, its own overrides)
    "rlt1-2+2": ("rlt-debug", ()),
    "rlt0-2+2": ("rlt-debug", ("model.feedback_interval=0",)),
    "transformer-4": ("rlt-transformer-debug", ()),
}


class _AlgorithmicStudy:
    """Runs of `rgpt algo train` and `rgpt algo eval`, one process each, two side by side."""

    needs_data = False
    presets = ("cpu",)
    default_nproc, default_jobs = 1, 2
    record: str | None = None
    checkpoint = "best"

    def commands(self, run: Run, ctx: Context) -> list[list[str]]:
        out = str(Path(ctx.out) / run.name)
        task = Path(run.config).stem
        train = python_command("launcher.algo", "train", task, "--model", run.model, "--seed", str(run.seed),
                               "--out", out, "--nproc", "1", *run.overrides)
        evaluate = python_command("launcher.algo", "eval", out, "--checkpoint", self.checkpoint, "--limit", str(LIMIT))
        return [train, evaluate]

    def _eval_dir(self) -> str:
        return "eval" if self.checkpoint == "best" else f"eval-{self.checkpoint}"

    def report(self, ctx: Context, runs: list[Run]) -> dict[str, Path]:
        out = Path(ctx.out) / "table"
        found = [str(Path(ctx.out) / run.name / self._eval_dir() / "eval.json") for run in runs]
        algo_cli.main(["table", *(p for p in found if Path(p).is_file()), "--out", str(out)])
        return {"md": out / "table.md", "json": out / "table.json", "png": out / "accuracy_vs_length.png"}

    def grid(self, root: Path) -> list[Path]:
        return suite_array.write(grid.ARRAY, root)  # slurm/algorithmic.sh: the whole grid at the paper's scale

    def record_files(self, run: Run) -> tuple[str, ...]:
        return ("config.yaml", "metrics.jsonl", f"{self._eval_dir()}/eval.json")


def _run(task: str, label: str, flavour: str, seed: int, overrides: tuple[str, ...]) -> Run:
    return Run(name=f"{task}-{label}-s{seed}", config=f"configs/algorithmic/{task}.yaml",
               family=FLAVOURS[flavour]["family"], seed=seed, model=flavour, overrides=overrides)


class Algorithmic(_AlgorithmicStudy):
    name = "algorithmic"
    summary = "parity and swaps-S5 with the debug Transformer, three seeds each: train, evaluate, table"
    reproduces = "the protocol end to end with the Transformer baseline at CPU scale (docs/algorithmic.md)"
    record = "results/algorithmic"

    def plan(self, preset: str) -> list[Run]:
        """Parity and swaps-S5 interleaved (the two lanes train one of each), seeds 42, 43, 44."""
        return [_run(task, "rlt-transformer-debug", "rlt-transformer-debug", seed, ALGO_RECIPE)
                for seed in (42, 43, 44) for task in ("parity", "s5_swaps")]


class RLT(_AlgorithmicStudy):
    name = "rlt"
    summary = ("the RLT headline at CPU scale, parity and swaps-S5: RLT-1, RLT-0, the Transformer, three seeds "
               "(79 min on 2 cores)")
    reproduces = ("partly: RLT-1 grows parity's range by a length curriculum (to 3-40 bits in two seeds of three) "
                  "and scores 100 % to 64 bits in every seed, where RLT-0 and the Transformer stay at chance "
                  "throughout; on swaps-S5 RLT-1 tracks the state past its 32 training operations (results/rlt, "
                  "docs/families.md)")
    checkpoint = "last"
    record = "results/rlt"

    def plan(self, preset: str) -> list[Run]:
        """Each model at seeds 42, 43 and 44 on parity, then on swaps-S5, RLT-1 first in each (the longest
        runs start first)."""
        return [_run(task, label, flavour, seed, (*recipe, *extra))
                for task, recipe in (("parity", RLT_RECIPE), ("s5_swaps", S5_RECIPE))
                for label, (flavour, extra) in RLT_MODELS.items() for seed in RLT_SEEDS]


ALGORITHMIC, RLT_STUDY = Algorithmic(), RLT()
