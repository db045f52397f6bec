"""The RLT paper's algorithmic experiments as one cluster array (slurm/algorithmic.sh, written from
ARRAY by `rgpt study algorithmic grid`): its three studies in array order, each its tasks x models x
seeds, trained at the paper's scale (configs/algorithmic/<task>.yaml) and evaluated at both
checkpoints (J.8: the best in-distribution validation loss, earliest tie, and the fixed last step).
No torch import."""
from __future__ import annotations

from rgpt_dist.algorithmic import TASKS
from rgpt_dist.models.rlt import SIXTEEN
from rgpt_dist.studies.suite_array import ArrayStudy, SuiteArray

SPLITS = ("4+4", "5+3", "6+2", "7+1", "8+0")
"""The eight-layer encoder + decoder splits of Tables 2, 3, 8 and 9."""
SEEDS = (42, 43, 44)

STUDIES = (
    ArrayStudy("main", tuple(TASKS), (*(f"rlt1-{s}" for s in SPLITS), "rlt-transformer-8"), SEEDS,
               about="6 tasks x (RLT-1 4+4 ... 8+0, Transformer 8) x seeds 42 43 44 (Tables 2, 3; Figures 6, 12)"),
    ArrayStudy("variants", tuple(TASKS), tuple(f"rlt{v}-{s}" for v in (0, 2) for s in SPLITS), SEEDS,
               about="6 tasks x (RLT-0, RLT-2 B = 4 at 4+4 ... 8+0) x 3 seeds (J.9, J.10, Tables 8, 9)"),
    ArrayStudy("sixteen", ("parity",), (*SIXTEEN, "rlt-transformer-16"), (42,), ("train.global_batch_size=1024",),
               about="parity x (RLT-1 8+8 ... 16+0, Transformer 16) x seed 42, global batch 1,024 (J.8, Table 7)"),
)

ARRAY = SuiteArray(
    path="slurm/algorithmic.sh", source="rgpt_dist/studies/algorithmic/grid.py", job_name="rgpt-algorithmic",
    intro="""
        The RLT paper's algorithmic length-generalisation experiments (docs/algorithmic.md): one array task per
        (study, task, model, seed) runs `rgpt-algo train`, then `rgpt-algo eval` of the best-validation-loss
        checkpoint (RUN/eval) and of the fixed last step (RUN/eval-last); a dependent job runs `rgpt-algo table`.
          mkdir -p logs && bash slurm/algorithmic.sh submit      # every study's array, then the table job after it
          bash slurm/algorithmic.sh submit main sixteen          # some studies only (their id ranges)
          bash slurm/algorithmic.sh list                         # each study's array ids
          sbatch slurm/algorithmic.sh                            # the whole array only
          sbatch --array=0-2 slurm/algorithmic.sh                # parity x RLT-1 4+4's three seeds only (ids below)
          STAGE=table sbatch --array=0 slurm/algorithmic.sh      # the table alone, over what exists
        CPU only, FP32, one process with four threads per run, as the paper ran it: no GPU is requested.
        A run at width 512 takes many CPU-hours (2,000 steps of 512 examples; 5,000 for mod-5): when the time
        limit nears, SLURM signals the batch shell (USR1, 120 s ahead), the run saves its step and stops, the
        shell requeues the job, and the requeued job resumes from that checkpoint (docs/cluster.md).
        """,
    cli="algo.py", runs="runs/algorithmic", studies=STUDIES,
    notes="""
        Steps come from configs/algorithmic/<task>.yaml: 2,000, and 5,000 for both mod-5 tasks (section 3.1, J.10).
        Every run is evaluated at both checkpoints (J.8's checkpoint choice: best ID validation loss, earliest
        tie, versus the fixed last step).

        Environment overrides (all optional):
          RGPT_ROOT        repository checkout                              [$SLURM_SUBMIT_DIR]
          RGPT_PYTHON      python with the project installed                [$RGPT_ROOT/.venv/bin/python or python]
          RGPT_RUNS        run directories: $RGPT_RUNS/<task>-<model>-s<seed> [$RGPT_ROOT/runs/algorithmic]
          RGPT_OVERRIDES   extra key=value overrides for every run, whitespace-separated, passed literally []
          STAGE            run (train + eval; the array) or table              [run]
          RGPT_DRY_RUN=1   print the commands instead of running them
        """,
    evaluations=(("eval", '"$1"'), ("eval", '"$1"', "--checkpoint", "last")),
    evaluations_about="RUN/eval (the best checkpoint), RUN/eval-last (the fixed last step)")
