# shellcheck shell=bash
# Shared by the slurm/<scale>_<grid>.sh job arrays and slurm/ablations.sh (sourced, not run). One
# array task trains one model of its grid cell: MODELS[SLURM_ARRAY_TASK_ID] at budget $BUDGET, config
# configs/experiments/<model>-<budget>.yaml, run directory $RGPT_RUNS/<model>-<budget>; a job script
# that sets BUDGETED=0 lists whole experiment names instead (<name>.yaml, $RGPT_RUNS/<name>).
#
# srun starts one torchrun per node; torchrun rendezvouses from the SLURM allocation (c10d on the
# first node) and starts NPROC_PER_NODE ranks of launcher/train.py. SLURM's warning signal
# (--signal=B:USR1@120) reaches this shell, which passes it to the job step; torchrun forwards it
# to its ranks, which finish the current step and save it (rgpt_dist/train/preemption.py); this
# shell then requeues the job (`scontrol requeue`, on the host: it works with containers that lack
# the SLURM client too), and the requeued job resumes from that checkpoint. A node lost or a rank
# stalled mid-run ends the step within parallel.timeout_s plus a few seconds; the survivors leave
# RUN_DIR/interrupted.json naming the rank and node, and this shell requeues the job the same way.
#
# Environment overrides (all optional):
#   BUDGET=20k|40k          training budget (standard / doubled)                   [20k]
#   RGPT_ROOT               repository checkout                                    [$SLURM_SUBMIT_DIR]
#   RGPT_PYTHON             python with the project installed                      [$RGPT_ROOT/.venv/bin/python or python]
#   RGPT_CONFIG_DIR         experiment configs                                     [$RGPT_ROOT/configs/experiments]
#   RGPT_RUNS               where run directories go                               [$RGPT_ROOT/runs]
#   RGPT_OVERRIDES          extra key=value config overrides, whitespace-separated []
#   NPROC_PER_NODE          ranks per node                                         [GPUs on the node, else 1]
#   MASTER_PORT             rendezvous port                                        [20000 + job id % 20000]
#   SHUTDOWN_TIMEOUT        seconds torchrun waits for ranks to save after a signal [110]
#   SRUN_ARGS               extra srun arguments, e.g. pyxis' "--container-image=... --container-mounts=..." []
#   RGPT_DRY_RUN=1          print the command instead of running it
#
# RGPT_OVERRIDES and SRUN_ARGS are split at whitespace and nothing else: each word is passed as it is
# (no globbing, so `train.lr=3e-4 data.paths=[/d/*]` reaches the trainer literally; no quote
# removal or expansion either, so a value cannot hold a space: write YAML lists without spaces,
# e.g. data.paths=[/a,/b]).
# SLURM's ids are checked to be decimal numbers before any arithmetic: bash evaluates a variable's
# value in (( )) as an expression, so an id such as 'a[$(cmd)]' would run cmd.

set -euo pipefail

require_id() {  # NAME VALUE: VALUE must be a decimal number (10 digits at most: no overflow either)
    if [[ ! "$2" =~ ^[0-9]{1,10}$ ]]; then
        echo "slurm/common.sh: $1=$(printf '%q' "$2") is not a decimal job or task id" >&2
        exit 2
    fi
}

json_string() {  # VALUE: VALUE as a JSON string, which YAML reads back unchanged: a path with #, comma,
    # spaces, quotes or $ stays one literal path in a key=value override (rgpt_dist.sections.literal_override)
    if [[ "$1" == *[[:cntrl:]]* ]]; then
        echo "slurm/common.sh: a control character in $(printf '%q' "$1"): refusing it as a path" >&2
        exit 2
    fi
    local s=${1//\\/\\\\}
    printf '"%s"' "${s//\"/\\\"}"
}

split_words() {  # NAME TEXT: the array NAME holds TEXT's whitespace-separated words, unglobbed
    # read splits at $IFS only; it never globs or expands. -d '' reads past newlines (and returns
    # 1 at the end of its input, hence || true).
    read -r -d '' -a "$1" <<< "$2" || true
}

if [[ -z "${MODELS+x}" || ${#MODELS[@]} -eq 0 ]]; then
    echo "slurm/common.sh: the job script must define MODELS=(...)" >&2
    exit 2
fi
TASK=${SLURM_ARRAY_TASK_ID:-0}
require_id SLURM_ARRAY_TASK_ID "$TASK"
require_id SLURM_JOB_ID "${SLURM_JOB_ID:-0}"
[[ -z "${SLURM_ARRAY_JOB_ID:-}" ]] || require_id SLURM_ARRAY_JOB_ID "$SLURM_ARRAY_JOB_ID"
TASK=$(( 10#$TASK ))  # 10#: a leading zero is not octal
if (( TASK >= ${#MODELS[@]} )); then
    echo "array task $TASK: this cell has ${#MODELS[@]} models (${MODELS[*]}); use --array=0-$(( ${#MODELS[@]} - 1 ))" >&2
    exit 2
fi
MODEL=${MODELS[$TASK]}
BUDGET=${BUDGET:-20k}
BUDGETED=${BUDGETED:-1}
RGPT_ROOT=${RGPT_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
if [[ -z "${RGPT_PYTHON:-}" ]]; then
    RGPT_PYTHON=python
    [[ -x "$RGPT_ROOT/.venv/bin/python" ]] && RGPT_PYTHON="$RGPT_ROOT/.venv/bin/python"
fi
RGPT_CONFIG_DIR=${RGPT_CONFIG_DIR:-$RGPT_ROOT/configs/experiments}
RGPT_RUNS=${RGPT_RUNS:-$RGPT_ROOT/runs}
if [[ "$BUDGETED" == 1 ]]; then
    NAME="$MODEL-$BUDGET"
    WHY="for model $MODEL at budget $BUDGET (BUDGET must be 20k or 40k)"
else
    NAME=$MODEL BUDGET="(the config's)"
    WHY="(regenerate the grid: rgpt study <name> grid)"
fi
CONFIG="$RGPT_CONFIG_DIR/${CONFIG_SUBDIR:+$CONFIG_SUBDIR/}$NAME.yaml"  # CONFIG_SUBDIR: a grid's own folder (phi)
RUN_DIR="$RGPT_RUNS/$NAME"
if [[ ! -f "$CONFIG" ]]; then
    echo "no config $CONFIG $WHY" >&2
    exit 2
fi

NNODES=${SLURM_JOB_NUM_NODES:-1}
NPROC_PER_NODE=${NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}
# The rendezvous host: the allocation's first node (SLURM_JOB_NODELIST is a hostlist, `node[01-02]`), at
# the address SLURM itself reaches it by (its NodeAddr, where a node's name is not its network name),
# else by its name. Without the SLURM client (a container lacking it): localhost, one node only.
FIRST_NODE=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" 2>/dev/null | head -n 1 || true)
FIRST_NODE=${FIRST_NODE:-localhost}
NODE_ADDR=$(scontrol -o show node "$FIRST_NODE" 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | head -n 1 | cut -d= -f2- || true)
MASTER_ADDR=${NODE_ADDR:-$FIRST_NODE}
MASTER_PORT=${MASTER_PORT:-$(( 20000 + 10#${SLURM_JOB_ID:-0} % 20000 ))}
SHUTDOWN_TIMEOUT=${SHUTDOWN_TIMEOUT:-110}

# ${A[@]+"${A[@]}"}: an empty array under set -u (bash < 4.4 calls "${A[@]}" unbound)
EXTRA_OVERRIDES=() EXTRA_SRUN_ARGS=()
split_words EXTRA_OVERRIDES "${RGPT_OVERRIDES:-}"
split_words EXTRA_SRUN_ARGS "${SRUN_ARGS:-}"
# the batch shell requeues (below), so the trainer must not as well
RUN_DIR_JSON=$(json_string "$RUN_DIR") || exit 2
OVERRIDES=("log.run_dir=$RUN_DIR_JSON" "checkpoint.requeue=false" ${EXTRA_OVERRIDES[@]+"${EXTRA_OVERRIDES[@]}"})
# shellcheck disable=SC2054  # the commas are in --signals-to-handle
CMD=(srun --kill-on-bad-exit=1 --ntasks-per-node=1 --nodes="$NNODES" ${EXTRA_SRUN_ARGS[@]+"${EXTRA_SRUN_ARGS[@]}"}
     "$RGPT_PYTHON" -m torch.distributed.run
     --nnodes="$NNODES" --nproc_per_node="$NPROC_PER_NODE"
     --rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv_id="${SLURM_JOB_ID:-0}"
     --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 --shutdown-timeout="$SHUTDOWN_TIMEOUT"
     "$RGPT_ROOT/launcher/train.py" "$CONFIG" "${OVERRIDES[@]}")

echo "[$(date -Is)] job ${SLURM_JOB_ID:-?} task $TASK (restart ${SLURM_RESTART_COUNT:-0}): $MODEL $BUDGET on $NNODES node(s) x $NPROC_PER_NODE ranks"
if [[ "${RGPT_DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${CMD[@]}"; echo
    exit 0
fi

cd "$RGPT_ROOT"
# shellcheck source-path=SCRIPTDIR source=supervise.sh
source "$RGPT_ROOT/slurm/supervise.sh"
# shellcheck disable=SC2329  # called by supervise
pass_to_step() { scancel --signal="$1" "${SLURM_JOB_ID}" || kill -"$1" "$2"; }  # every task of the job step
# left by the trainer when a node or rank was lost (a requeue reason): only this attempt's counts
rm -f "$RUN_DIR/interrupted.json"
"${CMD[@]}" &
status=0
supervise "$!" pass_to_step "$RUN_DIR/interrupted.json" || status=$?
exit "$status"
