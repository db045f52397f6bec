#!/bin/bash
# Silent-thinking depth recurrence in its authors' settings (docs/thinking.md): one array task per
# (study, task, model, seed) runs `rgpt-think train`, then `rgpt-think frontier` of the last checkpoint
# (RUN/frontier); a dependent job runs `rgpt-think table`.
#   mkdir -p logs && bash slurm/thinking.sh submit       # every study's array, then the table job after it
#   bash slurm/thinking.sh submit graph logic            # some studies only (their id ranges)
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
# Written by `rgpt study ... grid` from rgpt_dist/studies/thinking/grid.py: edit the grid there, not here.
# The studies, in array order (slurm/studies.sh: id - offset = (task * |MODELS| + model) * |SEEDS|
# + seed):
#   graph       0-5      graph x (thinking-graph, its fixed-depth baseline) x seeds 42 43 44
#   logic       6-11     logic x (thinking-logic, its fixed-depth baseline) x seeds 42 43 44
#   relational  12-17    relational x (thinking-relational, its fixed-depth baseline) x seeds 42 43 44
#   sup10       18-20    graph x thinking-graph x 3 seeds, per-step supervision a = 0.10
#   sup25       21-23    graph x thinking-graph x 3 seeds, per-step supervision a = 0.25
#   sup50       24-26    graph x thinking-graph x 3 seeds, per-step supervision a = 0.50
#   sup75       27-29    graph x thinking-graph x 3 seeds, per-step supervision a = 0.75
#   sup90       30-32    graph x thinking-graph x 3 seeds, per-step supervision a = 0.90
#   sup100      33-35    graph x thinking-graph x 3 seeds, per-step supervision a = 1.00
# The supervision sweep's a = 0 is the graph study's (the authors' graph/supervision_sweep.py); its run
# directories are <task>-<model>-a<a>-s<seed>.
# Steps come from configs/thinking/<task>.yaml: the authors' epochs x batches (7,480, 15,000, 18,720).
#
# Environment overrides (all optional): as slurm/algorithmic.sh's (RGPT_ROOT, RGPT_PYTHON, RGPT_RUNS
# [$RGPT_ROOT/runs/thinking], RGPT_OVERRIDES, STAGE, RGPT_DRY_RUN).
STUDIES=(graph logic relational sup10 sup25 sup50 sup75 sup90 sup100)
# shellcheck disable=SC2034  # the study lists are read through namerefs (slurm/studies.sh)
{
    GRAPH_TASKS=(graph)
    GRAPH_MODELS=(thinking-graph thinking-graph-fixed)
    GRAPH_SEEDS=(42 43 44)
    GRAPH_OVERRIDES=()
    LOGIC_TASKS=(logic)
    LOGIC_MODELS=(thinking-logic thinking-logic-fixed)
    LOGIC_SEEDS=(42 43 44)
    LOGIC_OVERRIDES=()
    RELATIONAL_TASKS=(relational)
    RELATIONAL_MODELS=(thinking-relational thinking-relational-fixed)
    RELATIONAL_SEEDS=(42 43 44)
    RELATIONAL_OVERRIDES=()
    SUP10_TASKS=(graph)
    SUP10_MODELS=(thinking-graph)
    SUP10_SEEDS=(42 43 44)
    SUP10_OVERRIDES=(model.supervision_alpha=0.10)
    SUP10_SUFFIX=-a0.10
    SUP25_TASKS=(graph)
    SUP25_MODELS=(thinking-graph)
    SUP25_SEEDS=(42 43 44)
    SUP25_OVERRIDES=(model.supervision_alpha=0.25)
    SUP25_SUFFIX=-a0.25
    SUP50_TASKS=(graph)
    SUP50_MODELS=(thinking-graph)
    SUP50_SEEDS=(42 43 44)
    SUP50_OVERRIDES=(model.supervision_alpha=0.50)
    SUP50_SUFFIX=-a0.50
    SUP75_TASKS=(graph)
    SUP75_MODELS=(thinking-graph)
    SUP75_SEEDS=(42 43 44)
    SUP75_OVERRIDES=(model.supervision_alpha=0.75)
    SUP75_SUFFIX=-a0.75
    SUP90_TASKS=(graph)
    SUP90_MODELS=(thinking-graph)
    SUP90_SEEDS=(42 43 44)
    SUP90_OVERRIDES=(model.supervision_alpha=0.90)
    SUP90_SUFFIX=-a0.90
    SUP100_TASKS=(graph)
    SUP100_MODELS=(thinking-graph)
    SUP100_SEEDS=(42 43 44)
    SUP100_OVERRIDES=(model.supervision_alpha=1.00)
    SUP100_SUFFIX=-a1.00
}
SUITE=slurm/thinking.sh SUITE_CLI=think.py SUITE_RUNS=runs/thinking
export OMP_NUM_THREADS=4  # the runs' threads (--cpus-per-task)

show() { printf '%q ' "$@"; echo; }  # a command as the dry run prints it
# shellcheck disable=SC2329  # called by studies.sh
evaluations() {  # RUN_DIR: RUN/frontier, the last checkpoint over the task's grid
    local run=(show); [[ "${RGPT_DRY_RUN:-0}" == 1 ]] || run=()
    "${run[@]}" "${CLI[@]}" frontier "$1"
}
# shellcheck source-path=SCRIPTDIR source=studies.sh
source "${RGPT_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}/slurm/studies.sh"
