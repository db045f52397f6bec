"""Silent-thinking depth recurrence in its authors' settings as one cluster array (slurm/thinking.sh,
written from ARRAY by `rgpt study thinking grid`): each task with its model and fixed-depth baseline,
then the graph task's per-step supervision sweep. No torch import."""
from __future__ import annotations

from rgpt_dist.studies.suite_array import ArrayStudy, SuiteArray

SEEDS = (42, 43, 44)
ALPHAS = ("0.10", "0.25", "0.50", "0.75", "0.90", "1.00")
"""The supervision sweep's per-step weights a (a = 0 is the graph study's; the authors'
graph/supervision_sweep.py)."""

STUDIES = (
    *(ArrayStudy(task, (task,), (f"thinking-{task}", f"thinking-{task}-fixed"), SEEDS,
                 about=f"{task} x (thinking-{task}, its fixed-depth baseline) x seeds 42 43 44")
      for task in ("graph", "logic", "relational")),
    *(ArrayStudy(f"sup{round(float(alpha) * 100)}", ("graph",), ("thinking-graph",), SEEDS,
                 (f"model.supervision_alpha={alpha}",), suffix=f"-a{alpha}",
                 about=f"graph x thinking-graph x 3 seeds, per-step supervision a = {alpha}") for alpha in ALPHAS),
)

ARRAY = SuiteArray(
    path="slurm/thinking.sh", source="rgpt_dist/studies/thinking/grid.py", job_name="rgpt-thinking",
    intro="""
        Silent-thinking depth recurrence in its authors' settings (docs/thinking.md): one array task per
        (study, task, model, seed) runs `rgpt-think train`, then `rgpt-think frontier` of the last checkpoint
        (RUN/frontier); a dependent job runs `rgpt-think table`.
          mkdir -p logs && bash slurm/thinking.sh submit       # every study's array, then the table job after it
          bash slurm/thinking.sh submit graph logic            # some studies only (their id ranges)
          bash slurm/thinking.sh list                          # each study's array ids
          sbatch --array=0-2 slurm/thinking.sh                 # the graph task's three seeds only (ids below)
          STAGE=table sbatch --array=0 slurm/thinking.sh       # the table alone, over what exists
        CPU only, FP32, one process with four threads per run: the models hold 0.05-6.4M parameters. The
        longest run (thinking-logic-fixed, 15,000 steps of 128 expressions) takes hours on four cores; at the
        time limit the run saves its step and the job requeues and resumes (docs/cluster.md).
        """,
    cli="think.py", runs="runs/thinking", studies=STUDIES,
    notes="""
        The supervision sweep's a = 0 is the graph study's (the authors' graph/supervision_sweep.py); its run
        directories are <task>-<model>-a<a>-s<seed>.
        Steps come from configs/thinking/<task>.yaml: the authors' epochs x batches (7,480, 15,000, 18,720).

        Environment overrides (all optional): as slurm/algorithmic.sh's (RGPT_ROOT, RGPT_PYTHON, RGPT_RUNS
        [$RGPT_ROOT/runs/thinking], RGPT_OVERRIDES, STAGE, RGPT_DRY_RUN).
        """,
    evaluations=(("frontier", '"$1"'),),
    evaluations_about="RUN/frontier, the last checkpoint over the task's grid")
