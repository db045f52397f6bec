#!/bin/bash
# medium isoFLOPs cell of the paper's grid: one array task per model.
#   mkdir -p logs && sbatch slurm/medium_isoflops.sh                 # standard budget (20k steps)
#   BUDGET=40k sbatch slurm/medium_isoflops.sh                       # doubled budget
#   sbatch --nodes=2 --time=06:00:00 slurm/medium_isoflops.sh        # any #SBATCH line, from the command line
# Every setting and environment override: docs/cluster.md. Shared logic: slurm/common.sh.
#SBATCH --job-name=rgpt-medium-isoflops
#SBATCH --array=0-6
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-gpu=8
#SBATCH --time=12:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%A_%a.out

# Array task ids: 0 the dense baseline, 1 RecurrentGPT, then the competitors in the order they arrived
# (2 heavy-tail Poisson, 3 RRT, 4 Ouro, 5 Mixture-of-Recursions), 6 Mixture-of-Recursions at the dense model's
# training FLOPs (more steps: issue #29); new models are appended, so an id keeps its meaning.
# shellcheck disable=SC2034  # read by common.sh
MODELS=(gpt2-medium recurrentgpt-medium-isoflops poisson-medium-isoflops rrt-medium-isoflops ouro-medium-isoflops mor-medium-isoflops mor-medium-isoflops-flopmatched)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "${RGPT_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh"
