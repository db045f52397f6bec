#!/usr/bin/env bash
# Entrypoint of the rgpt-dist image: runs the command it is given (exec, so signals such as SLURM's
# SIGUSR1/SIGTERM reach it directly); with none, prints how to use the image.
set -euo pipefail

# Every cache must be writable. Under another UID than the image's user (docker run --user,
# apptainer run), the image's $HOME/.cache may not be: such caches move to a per-user folder in $TMPDIR.
fallback="${TMPDIR:-/tmp}/rgpt-cache-$(id -u)"
for var in XDG_CACHE_HOME HF_HOME TORCH_EXTENSIONS_DIR TRITON_CACHE_DIR MPLCONFIGDIR WANDB_CACHE_DIR WANDB_CONFIG_DIR; do
    dir="${!var:-}"
    [[ -n "$dir" ]] || continue
    if ! mkdir -p "$dir" 2>/dev/null || [[ ! -w "$dir" ]]; then
        export "$var=$fallback/${var,,}"
        mkdir -p "${!var}"
    fi
done

if [[ $# -eq 0 ]]; then
    cat <<'USAGE'
rgpt-dist image: give a command. From /workspace (mount data/ and runs/ there):
  torchrun --nproc_per_node 8 launcher/train.py configs/experiments/<cell>.yaml [key=value ...]
  deepspeed --num_gpus 8 launcher/train.py configs/experiments/<cell>.yaml [key=value ...]
  rgpt-prep INPUTS --out data/NAME --seq-len 1024     (rgpt-prep --help)
  rgpt-flops | rgpt-export | rgpt-eval                 (each with --help)
  python -m pytest -p no:cacheprovider -q -m "not slow"   (the test suite)
  bash                                                 (a shell; docker run -it)
See docs/docker.md.
USAGE
    exit 0
fi
exec "$@"
