# shellcheck shell=bash
# Shared by slurm/algorithmic.sh and slurm/thinking.sh (sourced, not run): a job array over studies,
# each TASKS x MODELS x SEEDS with its OVERRIDES; array id - study offset = (task * |MODELS| + model) *
# |SEEDS| + seed. One task trains its run (the suite's `train`), then runs the suite's evaluations; the
# `table` stage aggregates; `list` and `submit` work outside SLURM. The sourcing script sets:
#   SUITE            its path from the checkout, for messages and `submit` (slurm/algorithmic.sh)
#   SUITE_CLI        its command-line program under launcher/ (algo.py, think.py)
#   SUITE_RUNS       default run root under the checkout (runs/algorithmic)
#   STUDIES and <STUDY>_TASKS, _MODELS, _SEEDS, _OVERRIDES (and optionally _SUFFIX, added to the run
#                    directory's model part: studies that share a model and task need it)
#   evaluations RUN_DIR   a function running (or, with RGPT_DRY_RUN=1, printing through `show`) the
#                    evaluations of a trained run
# and exports OMP_NUM_THREADS (its runs' threads, = --cpus-per-task).
set -euo pipefail


require_id() {  # NAME VALUE: a decimal number (as slurm/common.sh: (( )) would evaluate an expression)
    if [[ ! "$2" =~ ^[0-9]{1,10}$ ]]; then
        echo "$SUITE: $1=$(printf '%q' "$2") is not a decimal job or task id" >&2
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
    echo "$SUITE: unknown study $(printf '%q' "$1") (one of ${STUDIES[*]})" >&2
    exit 2
}

SIZE=0
for name in "${STUDIES[@]}"; do SIZE=$(( SIZE + $(study_size "$name") )); done

RGPT_ROOT=${RGPT_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
if [[ -z "${RGPT_PYTHON:-}" ]]; then
    RGPT_PYTHON=python
    [[ -x "$RGPT_ROOT/.venv/bin/python" ]] && RGPT_PYTHON="$RGPT_ROOT/.venv/bin/python"
fi
RGPT_RUNS=${RGPT_RUNS:-$RGPT_ROOT/$SUITE_RUNS}
CLI=("$RGPT_PYTHON" "$RGPT_ROOT/launcher/$SUITE_CLI")
export PYTHONPATH="$RGPT_ROOT${PYTHONPATH:+:$PYTHONPATH}"

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
    script="$RGPT_ROOT/$SUITE"
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
    CMD=("${CLI[@]}" table "$RGPT_RUNS" --out "$RGPT_RUNS/table")
    echo "[$(date -Is)] job ${SLURM_JOB_ID:-?}: table over $RGPT_RUNS"
    if [[ "${RGPT_DRY_RUN:-0}" == 1 ]]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
    exec "${CMD[@]}"
elif [[ "${STAGE:-run}" != run ]]; then
    echo "$SUITE: STAGE=$(printf '%q' "$STAGE") must be run or table" >&2
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
suffix="${STUDY^^}_SUFFIX"
SEED=${SEEDS[$(( LOCAL % ${#SEEDS[@]} ))]}
MODEL=${MODELS[$(( LOCAL / ${#SEEDS[@]} % ${#MODELS[@]} ))]}
TASK=${TASKS[$(( LOCAL / (${#SEEDS[@]} * ${#MODELS[@]}) ))]}
RUN_DIR="$RGPT_RUNS/$TASK-$MODEL${!suffix:-}-s$SEED"
EXTRA=()
read -r -d '' -a EXTRA <<< "${RGPT_OVERRIDES:-}" || true   # split at whitespace only, never globbed
# the batch shell requeues (below), so the trainer must not as well; the user's overrides come last
TRAIN=("${CLI[@]}" train "$TASK" --model "$MODEL" --seed "$SEED" --out "$RUN_DIR" --nproc 1
       checkpoint.requeue=false ${OVERRIDES[@]+"${OVERRIDES[@]}"} ${EXTRA[@]+"${EXTRA[@]}"})

echo "[$(date -Is)] job ${SLURM_JOB_ID:-?} task $TASK_ID (restart ${SLURM_RESTART_COUNT:-0}):" \
     "$STUDY $TASK $MODEL seed $SEED"
if [[ "${RGPT_DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${TRAIN[@]}"; echo
    evaluations "$RUN_DIR"
    exit 0
fi

# shellcheck source-path=SCRIPTDIR source=supervise.sh
source "$RGPT_ROOT/slurm/supervise.sh"
# shellcheck disable=SC2329  # called by supervise
pass_to_run() { kill -"$1" "$2"; }  # the suite's CLI passes the warning signal to torchrun, which passes it to the rank
"${TRAIN[@]}" &
status=0
supervise "$!" pass_to_run || status=$?
(( status == 0 )) || exit "$status"
set -e
evaluations "$RUN_DIR"
