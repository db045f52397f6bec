#!/bin/bash
# large isoParams cell of the paper's grid: one array task per model.
#   mkdir -p logs && sbatch slurm/large_isoparams.sh                 # standard budget (20k steps)
#   BUDGET=40k sbatch slurm/large_isoparams.sh                       # doubled budget
#   sbatch --nodes=2 --time=06:00:00 slurm/large_isoparams.sh        # any #SBATCH line, from the command line
# Every setting and environment override: docs/cluster.md. Shared logic: slurm/common.sh.
#SBATCH --job-name=rgpt-large-isoparams
#SBATCH --array=0-3
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-gpu=8
#SBATCH --time=48:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%A_%a.out

# Array task ids: 0 the dense baseline, 1 RecurrentGPT, then the competitors in the order they arrived
# (2 heavy-tail Poisson, 3 Mixture-of-Recursions; the paper trains RRT and Ouro in the isoFLOPs cells
# only); new models are appended, so an id keeps its meaning.
# shellcheck disable=SC2034  # read by common.sh
MODELS=(gpt2-large recurrentgpt-large-isoparams poisson-large-isoparams mor-large-isoparams)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "${RGPT_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh"
