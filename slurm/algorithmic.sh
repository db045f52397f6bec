#!/bin/bash
# The RLT paper's algorithmic length-generalisation grid (docs/algorithmic.md): one array task per
# (task, model, seed) runs `rgpt-algo train` then `rgpt-algo eval`; a dependent job runs `rgpt-algo table`.
#   mkdir -p logs && bash slurm/algorithmic.sh submit      # the array, then the table job after it
#   sbatch slurm/algorithmic.sh                            # the array only
#   sbatch --array=0-2 slurm/algorithmic.sh                # parity's three seeds only (task ids below)
#   STAGE=table sbatch --array=0 slurm/algorithmic.sh      # the table alone, over what exists
# CPU only, FP32, one process with four threads per run, as the paper ran it: no GPU is requested.
# A run at width 512 takes many CPU-hours (2,000 steps of 512 examples; 5,000 for mod-5): when the time
# limit nears, SLURM signals the batch shell (USR1, 120 s ahead), the run saves its step and stops, the
# shell requeues the job, and the requeued job resumes from that checkpoint (docs/cluster.md).
#SBATCH --job-name=rgpt-algorithmic
#SBATCH --array=0-17
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
# The grid: TASKS x MODELS x SEEDS, array task id = (task * ${#MODELS[@]} + model) * ${#SEEDS[@]} + seed;
# --array above must be 0-(TASKS x MODELS x SEEDS - 1) (tests/slurm/test_algorithmic.py checks it).
# MODELS holds the Transformer baseline; issue 25 adds the RLT models (the paper's splits 4+4 ... 8+0)
# here, and --array grows with it:
#    0-2   parity        rlt-transformer-8  seeds 42 43 44
#    3-5   s5_standard   rlt-transformer-8
#    6-8   s5_swaps      rlt-transformer-8
#    9-11  mod5_flat     rlt-transformer-8  (5,000 steps)
#   12-14  mod5_brackets rlt-transformer-8  (5,000 steps)
#   15-17  addition      rlt-transformer-8
#
# Environment overrides (all optional):
#   RGPT_ROOT        repository checkout                              [$SLURM_SUBMIT_DIR]
#   RGPT_PYTHON      python with the project installed                [$RGPT_ROOT/.venv/bin/python or python]
#   RGPT_RUNS        run directories: $RGPT_RUNS/<task>-<model>-s<seed> [$RGPT_ROOT/runs/algorithmic]
#   RGPT_OVERRIDES   extra key=value overrides for every run, whitespace-separated, passed literally []
#   STAGE            run (train + eval; the array) or table              [run]
#   RGPT_DRY_RUN=1   print the commands instead of running them
TASKS=(parity s5_standard s5_swaps mod5_flat mod5_brackets addition)
MODELS=(rlt-transformer-8)
SEEDS=(42 43 44)
set -euo pipefail

require_id() {  # NAME VALUE: a decimal number (as slurm/common.sh: (( )) would evaluate an expression)
    if [[ ! "$2" =~ ^[0-9]{1,10}$ ]]; then
        echo "slurm/algorithmic.sh: $1=$(printf '%q' "$2") is not a decimal job or task id" >&2
        exit 2
    fi
}

RGPT_ROOT=${RGPT_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
if [[ -z "${RGPT_PYTHON:-}" ]]; then
    RGPT_PYTHON=python
    [[ -x "$RGPT_ROOT/.venv/bin/python" ]] && RGPT_PYTHON="$RGPT_ROOT/.venv/bin/python"
fi
RGPT_RUNS=${RGPT_RUNS:-$RGPT_ROOT/runs/algorithmic}
ALGO=("$RGPT_PYTHON" "$RGPT_ROOT/launcher/algo.py")
SIZE=$(( ${#TASKS[@]} * ${#MODELS[@]} * ${#SEEDS[@]} ))
export OMP_NUM_THREADS=4 PYTHONPATH="$RGPT_ROOT${PYTHONPATH:+:$PYTHONPATH}"

if [[ "${1:-}" == submit ]]; then  # outside SLURM: the array, then the table once every task has ended
    script="$RGPT_ROOT/slurm/algorithmic.sh"
    if [[ "${RGPT_DRY_RUN:-0}" == 1 ]]; then
        echo "sbatch --parsable --array=0-$(( SIZE - 1 )) $script"
        echo "sbatch --dependency=afterany:JOB --array=0 --export=ALL,STAGE=table $script"
        exit 0
    fi
    job=$(sbatch --parsable --array="0-$(( SIZE - 1 ))" "$script")
    sbatch --dependency="afterany:${job%%;*}" --array=0 --export=ALL,STAGE=table "$script"
    echo "submitted array job $job and its table job"
    exit 0
fi

TASK_ID=${SLURM_ARRAY_TASK_ID:-0}
require_id SLURM_ARRAY_TASK_ID "$TASK_ID"
require_id SLURM_JOB_ID "${SLURM_JOB_ID:-0}"
TASK_ID=$(( 10#$TASK_ID ))
cd "$RGPT_ROOT"
if [[ "${STAGE:-run}" == table ]]; then
    CMD=("${ALGO[@]}" table "$RGPT_RUNS" --out "$RGPT_RUNS/table")
    echo "[$(date -Is)] job ${SLURM_JOB_ID:-?}: table over $RGPT_RUNS"
    if [[ "${RGPT_DRY_RUN:-0}" == 1 ]]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
    exec "${CMD[@]}"
elif [[ "${STAGE:-run}" != run ]]; then
    echo "slurm/algorithmic.sh: STAGE=$(printf '%q' "$STAGE") must be run or table" >&2
    exit 2
fi
if (( TASK_ID >= SIZE )); then
    echo "array task $TASK_ID: the grid has $SIZE runs (${#TASKS[@]} tasks x ${#MODELS[@]} models x ${#SEEDS[@]} seeds); use --array=0-$(( SIZE - 1 ))" >&2
    exit 2
fi
SEED=${SEEDS[$(( TASK_ID % ${#SEEDS[@]} ))]}
MODEL=${MODELS[$(( TASK_ID / ${#SEEDS[@]} % ${#MODELS[@]} ))]}
TASK=${TASKS[$(( TASK_ID / (${#SEEDS[@]} * ${#MODELS[@]}) ))]}
RUN_DIR="$RGPT_RUNS/$TASK-$MODEL-s$SEED"
EXTRA=()
read -r -d '' -a EXTRA <<< "${RGPT_OVERRIDES:-}" || true   # split at whitespace only, never globbed
# the batch shell requeues (below), so the trainer must not as well
TRAIN=("${ALGO[@]}" train "$TASK" --model "$MODEL" --seed "$SEED" --out "$RUN_DIR" --nproc 1
       checkpoint.requeue=false ${EXTRA[@]+"${EXTRA[@]}"})
EVAL=("${ALGO[@]}" eval "$RUN_DIR")

echo "[$(date -Is)] job ${SLURM_JOB_ID:-?} task $TASK_ID (restart ${SLURM_RESTART_COUNT:-0}): $TASK $MODEL seed $SEED"
if [[ "${RGPT_DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${TRAIN[@]}"; echo
    printf '%q ' "${EVAL[@]}"; echo
    exit 0
fi

# shellcheck source-path=SCRIPTDIR source=supervise.sh
source "$RGPT_ROOT/slurm/supervise.sh"
# shellcheck disable=SC2329  # called by supervise
pass_to_run() { kill -"$1" "$2"; }  # rgpt-algo passes the warning signal to torchrun, which passes it to the rank
"${TRAIN[@]}" &
status=0
supervise "$!" pass_to_run || status=$?
(( status == 0 )) || exit "$status"
set -e
"${EVAL[@]}"
