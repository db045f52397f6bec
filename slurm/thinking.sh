#!/bin/bash
# Silent-thinking depth recurrence in its authors' settings (docs/thinking.md): one array task per
# (study, task, model, seed) runs `rgpt-think train`, then `rgpt-think frontier` of the last checkpoint
# (RUN/frontier); a dependent job runs `rgpt-think table`.
#   mkdir -p logs && bash slurm/thinking.sh submit       # every study's array, then the table job after it
#   bash slurm/thinking.sh submit main                   # some studies only (their id ranges)
#   bash slurm/thinking.sh list                          # each study's array ids
#   sbatch --array=0-2 slurm/thinking.sh                 # the graph task's three seeds only (ids below)
#   STAGE=table sbatch --array=0 slurm/thinking.sh       # the table alone, over what exists
# CPU only, FP32, one process with four threads per run: the models hold 0.05-6.4M parameters. The
# longest run (thinking-logic-fixed, 15,000 steps of 128 expressions) takes hours on four cores; at the
# time limit the run saves its step and the job requeues and resumes (docs/cluster.md).
#SBATCH --job-name=rgpt-thinking
#SBATCH --array=0-35
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
# The studies, in array order (slurm/studies.sh: id - offset = (task * |MODELS| + model) * |SEEDS| + seed):
#   graph, logic, relational  0-5, 6-11, 12-17   the task x (thinking-<task>, its fixed-depth baseline
#                  thinking-<task>-fixed) x seeds 42 43 44
#   sup10 ... sup100  18-35  graph x thinking-graph x 3 seeds at per-step supervision a = 0.1 0.25 0.5
#                  0.75 0.9 1 (a = 0 is the graph study's; the authors' graph/supervision_sweep.py); run
#                  directories <task>-<model>-a<a>-s<seed>
# Steps come from configs/thinking/<task>.yaml: the authors' epochs x batches (7,480, 15,000, 18,720).
#
# Environment overrides (all optional): as slurm/algorithmic.sh's (RGPT_ROOT, RGPT_PYTHON, RGPT_RUNS
# [$RGPT_ROOT/runs/thinking], RGPT_OVERRIDES, STAGE, RGPT_DRY_RUN).
STUDIES=(graph logic relational sup10 sup25 sup50 sup75 sup90 sup100)
# shellcheck disable=SC2034  # the study lists are read through namerefs (studies.sh)
{
    for t in graph logic relational; do
        declare -a "${t^^}_TASKS=($t)" "${t^^}_MODELS=(thinking-$t thinking-$t-fixed)" "${t^^}_SEEDS=(42 43 44)" \
            "${t^^}_OVERRIDES=()"
    done
    for a in 10 25 50 75 90 100; do
        declare -a "SUP${a}_TASKS=(graph)" "SUP${a}_MODELS=(thinking-graph)" "SUP${a}_SEEDS=(42 43 44)"
        alpha=$(printf '%d.%02d' $(( a / 100 )) $(( a % 100 )))
        declare -a "SUP${a}_OVERRIDES=(model.supervision_alpha=$alpha)"
        declare "SUP${a}_SUFFIX=-a$alpha"
    done
}
SUITE=slurm/thinking.sh SUITE_CLI=think.py SUITE_RUNS=runs/thinking
export OMP_NUM_THREADS=4  # --cpus-per-task

show() { printf '%q ' "$@"; echo; }  # a command as the dry run prints it
# shellcheck disable=SC2329  # called by studies.sh
evaluations() {  # RUN_DIR: RUN/frontier, the last checkpoint over the task's grid
    local run=(show); [[ "${RGPT_DRY_RUN:-0}" == 1 ]] || run=()
    "${run[@]}" "${CLI[@]}" frontier "$1"
}
# shellcheck source-path=SCRIPTDIR source=studies.sh
source "${RGPT_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}/slurm/studies.sh"
