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
# The studies, in array order; each is its TASKS x MODELS x SEEDS with its OVERRIDES, and inside a study
# id - offset = (task * |MODELS| + model) * |SEEDS| + seed. --array above must be 0-(total - 1)
# (tests/slurm/test_algorithmic.py checks it; `submit` computes the ranges from the lists):
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
SPLITS=(4+4 5+3 6+2 7+1 8+0)
# shellcheck disable=SC2034  # the study lists are read through namerefs (study_lists)
{
    MAIN_TASKS=(parity s5_standard s5_swaps mod5_flat mod5_brackets addition)
    MAIN_MODELS=("${SPLITS[@]/#/rlt1-}" rlt-transformer-8)
    MAIN_SEEDS=(42 43 44)
    MAIN_OVERRIDES=()
    VARIANTS_TASKS=("${MAIN_TASKS[@]}")
    VARIANTS_MODELS=("${SPLITS[@]/#/rlt0-}" "${SPLITS[@]/#/rlt2-}")
    VARIANTS_SEEDS=(42 43 44)
    VARIANTS_OVERRIDES=()
    SIXTEEN_TASKS=(parity)
    SIXTEEN_MODELS=(rlt1-8+8 rlt1-9+7 rlt1-10+6 rlt1-11+5 rlt1-12+4 rlt1-13+3 rlt1-14+2 rlt1-15+1 rlt1-16+0
                    rlt-transformer-16)
    SIXTEEN_SEEDS=(42)
    SIXTEEN_OVERRIDES=(train.global_batch_size=1024)
}
set -euo pipefail

require_id() {  # NAME VALUE: a decimal number (as slurm/common.sh: (( )) would evaluate an expression)
    if [[ ! "$2" =~ ^[0-9]{1,10}$ ]]; then
        echo "slurm/algorithmic.sh: $1=$(printf '%q' "$2") is not a decimal job or task id" >&2
        exit 2
    fi
}

study_size() {  # STUDY: its number of runs, |TASKS| x |MODELS| x |SEEDS|
    local -n tasks="${1^^}_TASKS" models="${1^^}_MODELS" seeds="${1^^}_SEEDS"
    echo $(( ${#tasks[@]} * ${#models[@]} * ${#seeds[@]} ))
}

study_range() {  # STUDY: its array ids FIRST-LAST
    local name offset=0
    for name in "${STUDIES[@]}"; do
        if [[ "$name" == "$1" ]]; then echo "$offset-$(( offset + $(study_size "$name") - 1 ))"; return 0; fi
        offset=$(( offset + $(study_size "$name") ))
    done
    echo "slurm/algorithmic.sh: unknown study $(printf '%q' "$1") (one of ${STUDIES[*]})" >&2
    exit 2
}

SIZE=0
for name in "${STUDIES[@]}"; do SIZE=$(( SIZE + $(study_size "$name") )); done

RGPT_ROOT=${RGPT_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
if [[ -z "${RGPT_PYTHON:-}" ]]; then
    RGPT_PYTHON=python
    [[ -x "$RGPT_ROOT/.venv/bin/python" ]] && RGPT_PYTHON="$RGPT_ROOT/.venv/bin/python"
fi
RGPT_RUNS=${RGPT_RUNS:-$RGPT_ROOT/runs/algorithmic}
ALGO=("$RGPT_PYTHON" "$RGPT_ROOT/launcher/algo.py")
export OMP_NUM_THREADS=4 PYTHONPATH="$RGPT_ROOT${PYTHONPATH:+:$PYTHONPATH}"

if [[ "${1:-}" == list ]]; then  # each study's ids and size
    for name in "${STUDIES[@]}"; do echo "$name $(study_range "$name") ($(study_size "$name") runs)"; done
    echo "all 0-$(( SIZE - 1 )) ($SIZE runs)"
    exit 0
fi
if [[ "${1:-}" == submit ]]; then  # outside SLURM: the array (all studies, or those named), then the table
    shift
    ranges=()
    for name in "${@:-${STUDIES[@]}}"; do ranges+=("$(study_range "$name")"); done
    array=$(IFS=,; echo "${ranges[*]}")
    (( $# )) || array="0-$(( SIZE - 1 ))"
    script="$RGPT_ROOT/slurm/algorithmic.sh"
    if [[ "${RGPT_DRY_RUN:-0}" == 1 ]]; then
        echo "sbatch --parsable --array=$array $script"
        echo "sbatch --dependency=afterany:JOB --array=0 --export=ALL,STAGE=table $script"
        exit 0
    fi
    job=$(sbatch --parsable --array="$array" "$script")
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
    ranges=()
    for name in "${STUDIES[@]}"; do ranges+=("$name $(study_range "$name"),"); done
    ranges[-1]=${ranges[-1]%,}
    echo "array task $TASK_ID: the grid has $SIZE runs (${ranges[*]}); use --array=0-$(( SIZE - 1 ))" >&2
    exit 2
fi
# the study holding TASK_ID, then its (task, model, seed)
LOCAL=$TASK_ID
for STUDY in "${STUDIES[@]}"; do
    n=$(study_size "$STUDY")
    (( LOCAL < n )) && break
    LOCAL=$(( LOCAL - n ))
done
declare -n TASKS="${STUDY^^}_TASKS" MODELS="${STUDY^^}_MODELS" SEEDS="${STUDY^^}_SEEDS" OVERRIDES="${STUDY^^}_OVERRIDES"
SEED=${SEEDS[$(( LOCAL % ${#SEEDS[@]} ))]}
MODEL=${MODELS[$(( LOCAL / ${#SEEDS[@]} % ${#MODELS[@]} ))]}
TASK=${TASKS[$(( LOCAL / (${#SEEDS[@]} * ${#MODELS[@]}) ))]}
RUN_DIR="$RGPT_RUNS/$TASK-$MODEL-s$SEED"
EXTRA=()
read -r -d '' -a EXTRA <<< "${RGPT_OVERRIDES:-}" || true   # split at whitespace only, never globbed
# the batch shell requeues (below), so the trainer must not as well; the user's overrides come last
TRAIN=("${ALGO[@]}" train "$TASK" --model "$MODEL" --seed "$SEED" --out "$RUN_DIR" --nproc 1
       checkpoint.requeue=false ${OVERRIDES[@]+"${OVERRIDES[@]}"} ${EXTRA[@]+"${EXTRA[@]}"})
EVAL=("${ALGO[@]}" eval "$RUN_DIR")                              # RUN/eval: the best checkpoint
EVAL_LAST=("${ALGO[@]}" eval "$RUN_DIR" --checkpoint last)       # RUN/eval-last: the fixed last step

echo "[$(date -Is)] job ${SLURM_JOB_ID:-?} task $TASK_ID (restart ${SLURM_RESTART_COUNT:-0}):" \
     "$STUDY $TASK $MODEL seed $SEED"
if [[ "${RGPT_DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${TRAIN[@]}"; echo
    printf '%q ' "${EVAL[@]}"; echo
    printf '%q ' "${EVAL_LAST[@]}"; echo
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
"${EVAL_LAST[@]}"
