#!/bin/bash
# The paper's ablations and sensitivity sweeps (rgpt_dist/studies/ablation/grid.py): one array task per run.
#   mkdir -p logs && sbatch slurm/ablations.sh                 # every run
#   sbatch --array=0-4 slurm/ablations.sh                      # Fig. 5's rows only (tasks below)
# Every setting and environment override: docs/cluster.md. Shared logic: slurm/common.sh. The longest
# task (a small-cell run of 20k steps) needs about 0.7 node-hours at 40% MFU (rgpt-flops --budget).
#SBATCH --job-name=rgpt-ablations
#SBATCH --array=0-26
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-gpu=8
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%A_%a.out

# Array task ids (new runs are appended, so an id keeps its meaning); rows the main grid trains
# (Fig. 5's dense baseline and full model, the B.1 / B.6 defaults, the gate-thinking run's partner) are its
# runs, not repeated here:
#    0  ablation-fig5-2-recurrence
#    1  ablation-fig5-3-prelude-coda
#    2  ablation-fig5-4-state-noise
#    3  ablation-fig5-4b-noise-at-init
#    4  ablation-fig5-5-reinjection
#    5  ablation-table7-1-dense
#    6  ablation-table7-2-recurrence
#    7  ablation-table7-3-prelude-coda
#    8  ablation-table7-4-state-noise
#    9  ablation-table7-4b-noise-at-init
#   10  ablation-table7-5-reinjection
#   11  ablation-table7-6-gate
#   12  ablation-b4-tau0.5
#   13  ablation-b4-tau1
#   14  ablation-b4-tau2
#   15  ablation-b5-sigma0
#   16  ablation-b5-sigma0.05
#   17  ablation-b5-sigma0.2
#   18  ablation-b6-gatebias0
#   19  ablation-b6-gatebias-2
#   20  ablation-b6-sigma0
#   21  ablation-b6-sigma0.2
#   22  ablation-b1-seed42-recurrentgpt
#   23  ablation-b1-seed42-dense
#   24  ablation-b1-seed123-recurrentgpt
#   25  ablation-b1-seed123-dense
#   26  ablation-b6-gate-thinking
# shellcheck disable=SC2034  # read by common.sh
BUDGETED=0  # whole experiment names: configs/experiments/<name>.yaml
# shellcheck disable=SC2034
MODELS=(
    ablation-fig5-2-recurrence ablation-fig5-3-prelude-coda ablation-fig5-4-state-noise
    ablation-fig5-4b-noise-at-init ablation-fig5-5-reinjection ablation-table7-1-dense
    ablation-table7-2-recurrence ablation-table7-3-prelude-coda ablation-table7-4-state-noise
    ablation-table7-4b-noise-at-init ablation-table7-5-reinjection ablation-table7-6-gate
    ablation-b4-tau0.5 ablation-b4-tau1 ablation-b4-tau2
    ablation-b5-sigma0 ablation-b5-sigma0.05 ablation-b5-sigma0.2
    ablation-b6-gatebias0 ablation-b6-gatebias-2 ablation-b6-sigma0
    ablation-b6-sigma0.2 ablation-b1-seed42-recurrentgpt ablation-b1-seed42-dense
    ablation-b1-seed123-recurrentgpt ablation-b1-seed123-dense
    ablation-b6-gate-thinking)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "${RGPT_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh"
