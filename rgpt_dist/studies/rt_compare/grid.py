"""The layerwise Recurrent Transformer's runs in its authors' recipe (issue #27; SPEC section 9;
geniucos/recurrent-transformer, configs/kempner/base-c4-t5.yaml): every RT flavour of the authors'
150M / 300M settings next to its parameter-matched dense partner (`rt-dense-*`, gpt2 family).

The authors' recipe, and what we do where ours differs:
- 262,144 tokens per step: SPEC's sequence 512 x batch 512 (their base file: 1024 x 256, the same
  tokens); micro-batch 16 divides 512 on 8 or 16 GPUs (accumulation 4 or 2).
- AdamW lr 1e-3, betas (0.9, 0.95), decoupled weight decay 1e-5, gradient clip 1.0; cosine with a
  linear warmup of 1,250 steps to 0.1 x lr (their alpha_f). Their eps 1e-15 and weight decay on norms
  and embeddings are not settings of our optimizer (eps 1e-8, no decay on gains and biases): at a
  decay of 1e-5 over 12,500 steps that changes a weight by at most 12 %, their eps only matters where
  a second moment is below ~1e-16.
- Steps: 12,500 at 150M (their base file's max_duration: 3.3B tokens, "20x number of parameters", and
  their sweep_recurrent_150m_512.yaml's); 25,000 at 300M (their sweep_recurrent_512.yaml and
  sweep_olmo_512.yaml: the 300M runs at batch 512).
- Data: C4 tokenized with T5's tokenizer in theirs; ours is our pipeline's (GPT-2 BPE, data/c4 to be
  prepared with rgpt-prep --seq-len 512). Losses are therefore not comparable with their numbers.

Their sweep (`sweep`, configs/experiments/rt-sweep/, run by slurm/rt_grid.sh with RT_SWEEP=1): their
sweep files at sequence 512 x batch 512 (sweep_recurrent_150m_512.yaml, sweep_recurrent_512.yaml; their
dense sweep_olmo_512.yaml the same) override the base file with lr in {1e-3, 3.16e-3, 1e-2} x beta2 in
{0.95, 0.99}, weight decay 0, AdamW eps 1e-8 (ours), and a warm-up of 5,000 steps at 150M (of 12,500)
and 10,000 at 300M (of 25,000); the rest stays the base file's (cosine to 0.1 x lr, clip 1.0). At weight
decay 0 their decay of norms and embeddings changes nothing, so only the data differs. Each run of
`names()` at each of the 6 points: 60 runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rgpt_dist.sections import from_dict
from rgpt_dist.studies.base import run_config, write_configs, write_text
from rgpt_dist.models.flavours import flavour
from rgpt_dist.models.config import ModelConfig
from rgpt_dist.models.rt.config import SHAPES
from rgpt_dist.flops import gpu_hours as flops_gpu_hours

SEQ_LEN, GLOBAL_BATCH, MICRO_BATCH = 512, 512, 16
TOKENS_PER_STEP = SEQ_LEN * GLOBAL_BATCH
STEPS = {"150m": 12500, "300m": 25000}
RECIPE: dict[str, Any] = {"seq_len": SEQ_LEN, "global_batch_size": GLOBAL_BATCH, "micro_batch_size": MICRO_BATCH,
                          "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 1250, "weight_decay": 1e-5,
                          "beta1": 0.9, "beta2": 0.95, "grad_clip": 1.0}
PEAK_FLOPS, MFU, GPUS_PER_NODE = 989e12, 0.4, 8
"""slurm/rt_grid.sh's cost assumptions (as slurm/phi_grid.sh's)."""
SWEEP_LRS = {"1e-3": 1e-3, "3.16e-3": 3.16e-3, "1e-2": 1e-2}
SWEEP_BETA2S = (0.95, 0.99)
SWEEP_WARMUP = {"150m": 5000, "300m": 10000}
SWEEP_DIR = "rt-sweep"
"""Their sweep (module docstring): learning rates (name tag -> value), beta2s, warm-up per size, and
the configs' folder under configs/experiments (slurm/common.sh's CONFIG_SUBDIR)."""


def names() -> list[str]:
    """Run names in array order: per setting, the RT flavour then its dense partner."""
    return [name for shape in SHAPES for name in (f"rt-{shape}", f"rt-dense-{shape}")]


def grid() -> dict[str, dict[str, Any]]:
    """Experiment name (= flavour) -> config mapping."""
    out = {}
    for name in names():
        cfg = run_config(name, name, steps(name), **RECIPE)
        cfg["data"] = {"paths": ["data/c4"]}
        cfg["parallel"]["activation_checkpointing"] = "none"  # no recurrence to checkpoint per step
        out[name] = cfg
    return out


def steps(name: str) -> int:
    return STEPS[name.split("-")[-2]]  # rt[-dense]-<150m|300m>-<layers>


def sweep_points() -> dict[str, tuple[str, float, float]]:
    """Their sweep's run names in array order -> (the grid run, lr, beta2): per run of names(), lr
    then beta2 (task 6 r + 2 i + j: run r at SWEEP_LRS' i-th and SWEEP_BETA2S' j-th)."""
    return {f"{name}-lr{tag}-b{beta2:g}": (name, lr, beta2)
            for name in names() for tag, lr in SWEEP_LRS.items() for beta2 in SWEEP_BETA2S}


def sweep() -> dict[str, dict[str, Any]]:
    """Their sweep's configs: each grid run's with lr, min_lr = lr / 10, beta2, weight decay 0 and
    their warm-up."""
    out = {}
    base = grid()
    for name, (run, lr, beta2) in sweep_points().items():
        cfg = {**base[run], "train": {**base[run]["train"], "lr": lr, "min_lr": lr / 10, "beta2": beta2,
                                      "weight_decay": 0.0, "warmup_steps": SWEEP_WARMUP[run.split("-")[-2]]}}
        cfg["log"] = {**cfg["log"], "run_dir": f"runs/{name}"}
        out[name] = cfg
    return out


def gpu_hours(name: str) -> float:
    """GPU-hours of one run by rgpt_dist.flops.gpu_hours at PEAK_FLOPS x MFU."""

    model = from_dict(ModelConfig, flavour(name))
    return flops_gpu_hours(model, SEQ_LEN, steps(name), TOKENS_PER_STEP, PEAK_FLOPS, MFU)


def slurm_script() -> str:
    """slurm/rt_grid.sh (regenerate it after changing the grid: `rgpt study rt-compare grid`)."""
    table = "\n".join(f"#  {i:>2}  {name:<18} {steps(name):>6,} steps  {gpu_hours(name):>6,.0f} GPU-hours"
                      for i, name in enumerate(names()))
    total = sum(map(gpu_hours, names()))
    longest = max(names(), key=gpu_hours)
    points = list(sweep_points())
    per_run = len(SWEEP_LRS) * len(SWEEP_BETA2S)
    wrapped = "\n".join("        " + " ".join(points[i:i + per_run]) for i in range(0, len(points), per_run))
    return f"""#!/bin/bash
# The layerwise Recurrent Transformer against its dense partners in the authors' recipe (issue #27;
# rgpt_dist/studies/rt_compare/grid.py, generated by `rgpt study rt-compare grid`): one array task per run, whole
# experiment names (configs/experiments/<name>.yaml).
#   mkdir -p logs && sbatch slurm/rt_grid.sh          # every run
#   sbatch --array=0-3 slurm/rt_grid.sh               # the 150M setting only
# RT_SWEEP=1: the authors' sweep instead (issue #42; configs/experiments/{SWEEP_DIR}/<name>.yaml): each run below
# at lr in {{{", ".join(SWEEP_LRS)}}} x beta2 in {{{", ".join(f"{b:g}" for b in SWEEP_BETA2S)}}}, weight decay 0, warm-up \
{SWEEP_WARMUP["150m"]:,} (150M) / {SWEEP_WARMUP["300m"]:,} (300M)
# steps; task {per_run} r + {len(SWEEP_BETA2S)} i + j is run r at the i-th lr and the j-th beta2, {len(points)} tasks, \
{total * per_run:,.0f} GPU-hours:
#   RT_SWEEP=1 sbatch --array=0-{len(points) - 1} slurm/rt_grid.sh
# Every setting and environment override: docs/cluster.md. Shared logic: slurm/common.sh.
# Cost (rgpt_dist.flops.gpu_hours: training FLOPs / ({PEAK_FLOPS / 1e12:g} TFLOP/s x {MFU:.0%} MFU); evaluation,
# checkpoints and restarts not included): {total:,.0f} GPU-hours in all. The longest task ({longest}) needs
# about {gpu_hours(longest) / GPUS_PER_NODE:.1f} node-hours of {GPUS_PER_NODE} GPUs by FLOPs. The RT's prefill runs per-position steps
# (docs/performance.md: 3-4x the dense model's step per FLOP on CPU), so its tasks will take several
# times that; a task that reaches --time requeues itself and resumes from its checkpoint.
#SBATCH --job-name=rgpt-rt
#SBATCH --array=0-{len(names()) - 1}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-gpu=8
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%A_%a.out

# Array task ids:
{table}
# shellcheck disable=SC2034  # read by common.sh
BUDGETED=0  # whole experiment names: configs/experiments/<name>.yaml
# shellcheck disable=SC2034
MODELS=({' '.join(names())})
# shellcheck disable=SC2034  # read by common.sh; RT_SWEEP=1: the sweep's configs have their own folder
case "${{RT_SWEEP:-0}}" in
    0) ;;
    1) CONFIG_SUBDIR={SWEEP_DIR}
       MODELS=(
{wrapped})
       ;;
    *) echo "slurm/rt_grid.sh: RT_SWEEP=$(printf '%q' "$RT_SWEEP") must be 0 (the grid) or 1 (the authors' sweep)" >&2
       exit 2 ;;
esac
# shellcheck source-path=SCRIPTDIR source=common.sh
source "${{RGPT_ROOT:-${{SLURM_SUBMIT_DIR:-.}}}}/slurm/common.sh"
"""


def write_yaml(directory: str | Path) -> list[Path]:
    return write_configs(directory, grid(), lambda name: (
        f"# Layerwise Recurrent Transformer run {name} in its authors' recipe: generated from\n"
        f"# rgpt_dist/studies/rt_compare/grid.py (`rgpt study rt-compare grid`; the recipe and our departures are its docstring).\n"
        f"# Prepare data/c4 with rgpt-prep --seq-len {SEQ_LEN}; tokens/step = {GLOBAL_BATCH} x {SEQ_LEN}.\n"))


def write_sweep_yaml(directory: str | Path) -> list[Path]:
    return write_configs(directory, sweep(), lambda name: (
        f"# The authors' sweep point {name} (issue #42): generated from rgpt_dist/studies/rt_compare/grid.py\n"
        f"# (`rgpt study rt-compare grid`; their sweep files and what differs: its docstring). Run by\n"
        f"# RT_SWEEP=1 sbatch slurm/rt_grid.sh. Prepare data/c4 with rgpt-prep --seq-len {SEQ_LEN}.\n"))


def write_grid(root: Path) -> list[Path]:
    """The RT grid's configs (root/configs/experiments), their sweep's (root/configs/experiments/rt-sweep)
    and the array script running either (root/slurm/rt_grid.sh)."""
    written = write_yaml(root / "configs" / "experiments")
    written += write_sweep_yaml(root / "configs" / "experiments" / SWEEP_DIR)
    return [*written, write_text(root / "slurm" / "rt_grid.sh", slurm_script())]
