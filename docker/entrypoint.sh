#!/usr/bin/env bash
# Entrypoint of the rgpt-dist image: runs the command it is given (exec, so signals such as SLURM's
# SIGUSR1/SIGTERM reach it directly); with none, prints how to use the image.
set -euo pipefail

# Every cache must be writable. Under another UID than the image's user (docker run --user,
# apptainer run), the image's $HOME/.cache may not be: such caches move to a per-user folder in $TMPDIR.
fallback="${TMPDIR:-/tmp}/rgpt-cache-$(id -u)"

# The fallback holds code that is loaded and run (TORCH_EXTENSIONS_DIR: compiled .so files; the
# Triton cache), and $TMPDIR is shared: its name is predictable, so another user may have created it
# first. It is used only if it is ours alone: a real directory (no symlink), owned by us, mode 0700
# when we create it and never group- or world-writable. Otherwise refuse: what is inside may have
# been planted, so it is not "fixed" with chmod either.
private_fallback() {
    local mode
    if mkdir -m 700 "$fallback" 2>/dev/null; then
        return 0
    fi
    if [[ -L "$fallback" || ! -d "$fallback" ]]; then
        echo "rgpt-entrypoint: $fallback exists and is not a directory (or is a symlink): refusing to keep" \
             "caches there; remove it or set TMPDIR to a private directory" >&2
        exit 2
    fi
    mode=$(stat -c '%a' "$fallback")  # GNU stat (the image is Ubuntu)
    if [[ ! -O "$fallback" ]] || (( 8#$mode & 8#022 )); then
        echo "rgpt-entrypoint: $fallback is not private (owner $(stat -c '%U' "$fallback"), mode $mode):" \
             "another user could plant code there; remove it or set TMPDIR to a private directory" >&2
        exit 2
    fi
}

fallback_ready=0
for var in XDG_CACHE_HOME HF_HOME TORCH_EXTENSIONS_DIR TRITON_CACHE_DIR MPLCONFIGDIR WANDB_CACHE_DIR WANDB_CONFIG_DIR; do
    dir="${!var:-}"
    [[ -n "$dir" ]] || continue
    if ! mkdir -p "$dir" 2>/dev/null || [[ ! -w "$dir" ]]; then
        (( fallback_ready )) || { private_fallback; fallback_ready=1; }
        export "$var=$fallback/${var,,}"
        mkdir -p "${!var}"
    fi
done

if [[ $# -eq 0 ]]; then
    cat <<'USAGE'
rgpt-dist image: give a command. From /workspace (mount data/ and runs/ there):
  torchrun --nproc_per_node 8 launcher/train.py configs/experiments/<cell>.yaml [key=value ...]
  deepspeed --num_gpus 8 launcher/train.py configs/experiments/<cell>.yaml [key=value ...]
  rgpt train configs/experiments/<cell>.yaml --nproc 8  (prints the torchrun command it runs)
  rgpt prep INPUTS --out data/NAME --seq-len 1024      (rgpt --help: every verb)
  python -m pytest -p no:cacheprovider -q -m "not slow"   (the test suite)
  bash                                                 (a shell; docker run -it)
See docs/docker.md.
USAGE
    exit 0
fi
exec "$@"
