#!/bin/bash
# The RLT paper's algorithmic length-generalisation experiments (docs/algorithmic.md): one array task per
# (study, task, model, seed) runs `rgpt-algo train`, then `rgpt-algo eval` of the best-validation-loss
# checkpoint (RUN/eval) and of the fixed last step (RUN/eval-last); a dependent job runs `rgpt-algo table`.
#   mkdir -p logs && bash slurm/algorithmic.sh submit      # every study's array, then the table job after it
#   bash slurm/algorithmic.sh submit main sixteen          # some studies only (their id ranges)
#   bash slurm/algorithmic.sh list                         # each study's array ids
#   sbatch slurm/algorithmic.sh                            # the whole array only
#   sbatch --array=0-2 slurm/algorithmic.sh                # parity x RLT-1 4+4's three seeds only (ids below)
#   STAGE=table sbatch --array=0 slurm/algorithmic.sh      # the table alone, over what exists
# CPU only, FP32, one process with four threads per run, as the paper ran it: no GPU is requested.
# A run at width 512 takes many CPU-hours (2,000 steps of 512 examples; 5,000 for mod-5): when the time
# limit nears, SLURM signals the batch shell (USR1, 120 s ahead), the run saves its step and stops, the
# shell requeues the job, and the requeued job resumes from that checkpoint (docs/cluster.md).
#SBATCH --job-name=rgpt-algorithmic
#SBATCH --array=0-297
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=4
#SBATCH --mem=8G
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%A_%a.out
#
# Written by `rgpt study ... grid` from rgpt_dist/studies/algorithmic/grid.py: edit the grid there, not here.
# The studies, in array order (slurm/studies.sh: id - offset = (task * |MODELS| + model) * |SEEDS|
# + seed):
#   main      0-107    6 tasks x (RLT-1 4+4 ... 8+0, Transformer 8) x seeds 42 43 44 (Tables 2, 3; Figures 6, 12)
#   variants  108-287  6 tasks x (RLT-0, RLT-2 B = 4 at 4+4 ... 8+0) x 3 seeds (J.9, J.10, Tables 8, 9)
#   sixteen   288-297  parity x (RLT-1 8+8 ... 16+0, Transformer 16) x seed 42, global batch 1,024 (J.8, Table 7)
# Steps come from configs/algorithmic/<task>.yaml: 2,000, and 5,000 for both mod-5 tasks (section 3.1, J.10).
# Every run is evaluated at both checkpoints (J.8's checkpoint choice: best ID validation loss, earliest
# tie, versus the fixed last step).
#
# Environment overrides (all optional):
#   RGPT_ROOT        repository checkout                              [$SLURM_SUBMIT_DIR]
#   RGPT_PYTHON      python with the project installed                [$RGPT_ROOT/.venv/bin/python or python]
#   RGPT_RUNS        run directories: $RGPT_RUNS/<task>-<model>-s<seed> [$RGPT_ROOT/runs/algorithmic]
#   RGPT_OVERRIDES   extra key=value overrides for every run, whitespace-separated, passed literally []
#   STAGE            run (train + eval; the array) or table              [run]
#   RGPT_DRY_RUN=1   print the commands instead of running them
STUDIES=(main variants sixteen)
# shellcheck disable=SC2034  # the study lists are read through namerefs (slurm/studies.sh)
{
    MAIN_TASKS=(parity s5_standard s5_swaps mod5_flat mod5_brackets addition)
    MAIN_MODELS=(rlt1-4+4 rlt1-5+3 rlt1-6+2 rlt1-7+1 rlt1-8+0 rlt-transformer-8)
    MAIN_SEEDS=(42 43 44)
    MAIN_OVERRIDES=()
    VARIANTS_TASKS=(parity s5_standard s5_swaps mod5_flat mod5_brackets addition)
    VARIANTS_MODELS=(rlt0-4+4 rlt0-5+3 rlt0-6+2 rlt0-7+1 rlt0-8+0 rlt2-4+4 rlt2-5+3 rlt2-6+2 rlt2-7+1
                     rlt2-8+0)
    VARIANTS_SEEDS=(42 43 44)
    VARIANTS_OVERRIDES=()
    SIXTEEN_TASKS=(parity)
    SIXTEEN_MODELS=(rlt1-8+8 rlt1-9+7 rlt1-10+6 rlt1-11+5 rlt1-12+4 rlt1-13+3 rlt1-14+2 rlt1-15+1 rlt1-16+0
                    rlt-transformer-16)
    SIXTEEN_SEEDS=(42)
    SIXTEEN_OVERRIDES=(train.global_batch_size=1024)
}
SUITE=slurm/algorithmic.sh SUITE_CLI=algo.py SUITE_RUNS=runs/algorithmic
export OMP_NUM_THREADS=4  # the runs' threads (--cpus-per-task)

show() { printf '%q ' "$@"; echo; }  # a command as the dry run prints it
# shellcheck disable=SC2329  # called by studies.sh
evaluations() {  # RUN_DIR: RUN/eval (the best checkpoint), RUN/eval-last (the fixed last step)
    local run=(show); [[ "${RGPT_DRY_RUN:-0}" == 1 ]] || run=()
    "${run[@]}" "${CLI[@]}" eval "$1"
    "${run[@]}" "${CLI[@]}" eval "$1" --checkpoint last
}
# shellcheck source-path=SCRIPTDIR source=studies.sh
source "${RGPT_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}/slurm/studies.sh"
