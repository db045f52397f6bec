# shellcheck shell=bash
# Sourced by slurm/common.sh and slurm/algorithmic.sh (not run): wait for a job step started in the
# background, pass SLURM's warning signal to it, and requeue the job when that signal stopped it early.
#
#   "${CMD[@]}" &
#   pass() { kill -"$1" "$2"; }          # how SIGNAL (arg 1) reaches the step (arg 2: its pid)
#   supervise "$!" pass [MARKER]; status=$?   # the step's exit status
#
# SLURM (--signal=B:USR1@120) signals only the batch shell; the trap calls `pass`, the step saves its
# step and stops with a nonzero status, and the job is requeued (`scontrol requeue`, on the host: it
# works with containers that lack the SLURM client too); the requeued job resumes from that checkpoint.
# `wait` returns early (> 128) when a trapped signal arrives, so it is repeated until the step exits.
# MARKER (optional): a file the trainer leaves when a node or rank was lost or stalled mid-run
# (RUN_DIR/interrupted.json, rgpt_dist/train/run.py); a step that failed and left it is requeued too,
# and resumes from its newest complete checkpoint. The caller removes a stale one before the step.

supervise() {
    local pid=$1 pass=$2 marker=${3:-} status late job
    SIGNALLED=0
    # shellcheck disable=SC2329  # invoked by the traps below
    _supervise_forward() {
        echo "[$(date -Is)] $1 received: asking the run to save and stop"
        SIGNALLED=1
        "$pass" "$1" "$pid"
    }
    trap '_supervise_forward USR1' USR1
    trap '_supervise_forward TERM' TERM
    set +e
    while true; do
        wait "$pid"; status=$?
        if (( status < 128 )) || ! kill -0 "$pid" 2>/dev/null; then break; fi
    done
    wait "$pid" 2>/dev/null; late=$?   # the real status if a trap interrupted the last wait
    (( late != 127 )) && status=$late
    echo "[$(date -Is)] job step finished with status $status"
    if (( status != 0 )) && [[ -n "$marker" && -f "$marker" ]]; then
        echo "[$(date -Is)] the run was interrupted (a node or rank lost, or object storage unreachable): $(head -c 2000 "$marker")"
        SIGNALLED=1  # requeue, as for the warning signal
    fi
    if (( SIGNALLED && status != 0 )); then  # stopped early: continue in a new allocation
        job="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"
        job="${job:-$SLURM_JOB_ID}"
        echo "[$(date -Is)] requeueing job $job"
        scontrol requeue "$job"
    fi
    return "$status"
}
