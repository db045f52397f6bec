"""Silent-thinking depth recurrence at CPU scale (`rgpt study thinking`, `make thinking`): the
graph-reachability task with thinking-graph-debug (width 64, FFN 128; the authors' width 128, FFN 256),
seeds 42 and 43 side by side (one process each), 3,000 steps of 64 examples (192,000; the authors' 40
epochs of 12,000 are 7,480 steps), everything else the authors' recipe (configs/thinking/graph.yaml).
Each run's last checkpoint is scored over the authors' grid (hops 1-12 x steps 1-20, 500 examples per
hop count, `rgpt think frontier`) and `rgpt think table` writes OUT/table/{table.md,table.json,
frontier_*.png}. The cluster grid in the authors' settings: slurm/thinking.sh, written from grid.py
(docs/thinking.md). Its report imports torch (through the frontier module the table command shares).
"""
from __future__ import annotations

from pathlib import Path

from rgpt_dist.models.flavours import FLAVOURS
from rgpt_dist.studies import suite_array
from rgpt_dist.studies.base import Context, Run, python_command
from rgpt_dist.studies.thinking import grid
from rgpt_dist.thinking import cli as think_cli

RECIPE = ("train.max_steps=3000", "eval.every_steps=500", "checkpoint.every_steps=500", "log.wandb=disabled")
FLAVOUR = "thinking-graph-debug"


class Thinking:
    name = "thinking"
    summary = "the silent-thinking graph task's computational frontier at CPU scale, two seeds"
    reproduces = ("the frontier's shape on graph reachability (accuracy rising with thinking steps at every hop "
                  "count trained); recorded in results/thinking (docs/thinking.md)")
    needs_data = False
    presets = ("cpu",)
    default_nproc, default_jobs = 1, 2
    record: str | None = "results/thinking"

    def plan(self, preset: str) -> list[Run]:
        return [Run(name=f"graph-debug-s{seed}", config="configs/thinking/graph.yaml",
                    family=FLAVOURS[FLAVOUR]["family"], seed=seed, model=FLAVOUR, overrides=RECIPE)
                for seed in (42, 43)]

    def commands(self, run: Run, ctx: Context) -> list[list[str]]:
        out = str(Path(ctx.out) / run.name)
        task = Path(run.config).stem
        return [python_command("launcher.think", "train", task, "--model", run.model, "--seed", str(run.seed),
                               "--out", out, *run.overrides),
                python_command("launcher.think", "frontier", out)]

    def report(self, ctx: Context, runs: list[Run]) -> dict[str, Path]:
        out = Path(ctx.out) / "table"
        found = [Path(ctx.out) / run.name / "frontier" / "frontier.json" for run in runs]
        think_cli.main(["table", *(str(p) for p in found if p.is_file()), "--out", str(out)])
        return {"md": out / "table.md", "json": out / "table.json"}

    def grid(self, root: Path) -> list[Path]:
        return suite_array.write(grid.ARRAY, root)  # slurm/thinking.sh: the whole grid at the paper's scale

    def record_files(self, run: Run) -> tuple[str, ...]:
        return ("config.yaml", "metrics.jsonl", "frontier/frontier.json")


THINKING = Thinking()
