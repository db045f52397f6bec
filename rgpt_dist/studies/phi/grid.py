"""The looped scaling law's iso-depth sweep (issue #26, SPEC section 10) as experiment configs, beside
the main grid (rgpt_dist.studies.compare.grid) and the ablations. `rgpt study phi grid` writes them to
configs/experiments/phi/phi-*.yaml (a folder of their own: 380 files); slurm/phi_grid.sh runs them as
one array in `runs()` order. `rgpt study phi grid` writes both.

Layout 2 + r x (16 / r) + 2 (20 block executions at every r), r in {1, 2, 4, 8}, a fixed depth r in
training (no depth sampling) and full backprop, unless a study says otherwise. Studies (`STUDIES`):

    rgpt     RecurrentGPT, the paper's model (recurrentgpt-small-isoflops' fields) at a fixed depth
    plain    the plain looped baseline: heavy-tail Poisson's injection (adapter [s; e], noise start,
             state_std as default) at a fixed depth, k_max = r (full backprop)
    trunc    case study: plain with truncated backprop, k_max = ceil(r / 2), at the four lowest
             budgets; its r = 1 runs are phi-plain-r1-* (k_max = ceil(1/2) = 1 = r: the same run),
             so only r in {2, 4, 8} is generated (`study_runs` names the reused ones,
             `group_patterns` gives them as globs for `rgpt-eval phi --group`)
    nogate   case study: RecurrentGPT with gate=none (the core's output replaces the state; the same
             W_proj injection), at the four lowest budgets

The paper's four-budget refits do not say which four; we take the lowest four (4.64e17 ... 4.64e18:
less than half the compute of the middle four), and compare each case study with its baseline's
runs at the same four budgets (`baseline_runs`).

Budgets and widths: six compute budgets C (training FLOPs: rgpt_dist.flops.train_flops, 3 x Eq. 1
forward with the head, at seq_len 1024, x the recipe's 480 x 1024 tokens per step) log-spaced from
4.64e17 to 2.15e19. The paper gives no widths; per budget we take the WIDTHS_PER_BUDGET multiples of
128 (head_dim 64) whose tokens per non-embedding parameter at r = 1 (the rgpt model) lie in TPP_RANGE
and are nearest to TPP_CENTRE in log (the compute-optimal neighbourhood), the same widths for every
r and study: 6 x 5 x 4 = 120 runs per full study (the paper: 116). Each run's max_steps =
round(C / (train_flops x tokens/step)): steps differ slightly with r, and truncated runs, whose
no-grad steps cost no backward, get more steps for the same C. The achieved C is in each YAML's
header and in `runs()`.

Names: phi-<study>-r<r>-d<width>-c<budget>, e.g. phi-rgpt-r4-d768-c4.64e18; the `c` token is the
nominal budget (float() reads it); rgpt-eval phi groups runs by their achieved training FLOPs.
Runs warm up for 10% of their steps, at most the recipe's 2,000 (its 10% of 20k). No torch import.
"""
from __future__ import annotations

import dataclasses
import glob
import math
from pathlib import Path
from typing import Any

from rgpt_dist.eval.phi.analysis import expand
from rgpt_dist.eval.phi.fit import PhiInputError
from rgpt_dist.sections import from_dict
from rgpt_dist.studies.base import run_config, write_configs, write_text
from rgpt_dist.models.flavours import flavour
from rgpt_dist.models.config import ModelConfig
from rgpt_dist.config.train import TrainConfig
from rgpt_dist.flops import gpu_hours as flops_gpu_hours
from rgpt_dist.flops import param_count, train_flops

R_VALUES = (1, 2, 4, 8)
DEPTH = 16
"""Core block executions per token (n_rec x r); with the 2 + 2 prelude and coda, 20."""
N_PRE = N_CODA = 2
BUDGETS = {"4.64e17": 4.64e17, "1e18": 1e18, "2.15e18": 2.15e18, "4.64e18": 4.64e18, "1e19": 1e19, "2.15e19": 2.15e19}
"""Label (the name's c token) -> training FLOPs C."""
CASE_BUDGETS = tuple(BUDGETS)[:4]
"""The case studies' four budgets: the lowest four (our choice; the paper does not say)."""
WIDTH_STEP, HEAD_DIM, MAX_WIDTH = 128, 64, 4096
WIDTHS_PER_BUDGET = 5
TPP_RANGE = (2.0, 150.0)
"""Tokens per non-embedding parameter (r = 1 rgpt model) a chosen width must reach."""
TPP_CENTRE = 20.0
"""The widths nearest to this (in log) are chosen: around Chinchilla's ~20 tokens per parameter."""
SEQ_LEN = TrainConfig.seq_len
TOKENS_PER_STEP = TrainConfig.global_batch_size * TrainConfig.seq_len  # the recipe's 491,520


@dataclasses.dataclass(frozen=True)
class Study:
    """One study of the sweep: its base model section, the fields it sets per r, its budgets."""

    base: str
    """The flavour whose fields the model section starts from."""
    fields: Any
    """r -> the study's own model fields."""
    budgets: tuple[str, ...]
    r_values: tuple[int, ...]
    baseline: str | None = None
    """The study a case study is compared with (at its budgets)."""
    reused_r1: str | None = None
    """The study whose r = 1 runs are this study's (identical configs: not generated twice)."""


STUDIES = {
    "rgpt": Study("recurrentgpt-small-isoflops", lambda r: {"depth_sampler": "fixed"}, tuple(BUDGETS), R_VALUES),
    "plain": Study("poisson-small-isoflops", lambda r: {"depth_sampler": "fixed", "k_max": r}, tuple(BUDGETS),
                   R_VALUES),
    "trunc": Study("poisson-small-isoflops", lambda r: {"depth_sampler": "fixed", "k_max": math.ceil(r / 2)},
                   CASE_BUDGETS, R_VALUES[1:], baseline="plain", reused_r1="plain"),
    "nogate": Study("recurrentgpt-small-isoflops", lambda r: {"depth_sampler": "fixed", "gate": "none"},
                    CASE_BUDGETS, R_VALUES, baseline="rgpt"),
}


@dataclasses.dataclass(frozen=True)
class Run:
    """One generated run and its budget arithmetic."""

    name: str
    study: str
    r: int
    width: int
    budget: str
    steps: int
    train_flops_per_token: float
    achieved: float
    """Training FLOPs the run's max_steps reach: train_flops x TOKENS_PER_STEP x steps."""
    model: dict[str, Any]


def model_section(study: str, r: int, width: int) -> dict[str, Any]:
    """The YAML model section: the study's flavour, the iso-depth layout at `width`, its fields."""
    s = STUDIES[study]
    return {"flavour": s.base, "d_model": width, "n_head": width // HEAD_DIM, "n_pre": N_PRE,
            "n_rec": DEPTH // r, "n_loops": r, "n_coda": N_CODA, **s.fields(r)}


def model_config(section: dict[str, Any]) -> ModelConfig:
    """The typed model config of a model section (its flavour's fields, then its own)."""
    data = dict(section)
    return from_dict(ModelConfig, {**flavour(data.pop("flavour")), **data})


def steps_for(cfg: ModelConfig, budget: float) -> int:
    return max(1, round(budget / (train_flops(cfg, SEQ_LEN) * TOKENS_PER_STEP)))


def tokens_per_param(width: int, budget: float) -> float:
    """Tokens per non-embedding parameter of the r = 1 rgpt model at `width` trained on `budget`."""
    cfg = model_config(model_section("rgpt", 1, width))
    return steps_for(cfg, budget) * TOKENS_PER_STEP / param_count(cfg, embeddings=False)


def widths(budget: str) -> list[int]:
    """The budget's widths, ascending: in TPP_RANGE, the WIDTHS_PER_BUDGET nearest TPP_CENTRE (log)."""
    C = BUDGETS[budget]
    tpp = {d: tokens_per_param(d, C) for d in range(2 * WIDTH_STEP, MAX_WIDTH + 1, WIDTH_STEP)}
    inside = [d for d, t in tpp.items() if TPP_RANGE[0] <= t <= TPP_RANGE[1]]
    return sorted(sorted(inside, key=lambda d: abs(math.log(tpp[d] / TPP_CENTRE)))[:WIDTHS_PER_BUDGET])


def run_name(study: str, r: int, width: int, budget: str) -> str:
    return f"phi-{study}-r{r}-d{width}-c{budget}"


def _runs(study: str) -> list[Run]:
    out = []
    s = STUDIES[study]
    for budget in s.budgets:
        for width in widths(budget):
            for r in s.r_values:
                section = model_section(study, r, width)
                cfg = model_config(section)
                steps, per_token = steps_for(cfg, BUDGETS[budget]), train_flops(cfg, SEQ_LEN)
                out.append(Run(run_name(study, r, width, budget), study, r, width, budget, steps, per_token,
                               per_token * TOKENS_PER_STEP * steps, section))
    return out


_CACHE: dict[str, list[Run]] = {}


def runs(study: str | None = None) -> list[Run]:
    """The generated runs of `study` (None: every study, in slurm/phi_grid.sh's task order)."""
    if study is None:
        return [run for name in STUDIES for run in runs(name)]
    if study not in STUDIES:
        raise ValueError(f"unknown phi study {study!r} (known: {', '.join(STUDIES)})")
    if study not in _CACHE:
        _CACHE[study] = _runs(study)
    return list(_CACHE[study])


def sweep(study: str) -> dict[str, dict[str, Any]]:
    """Experiment name -> config mapping of the runs `study` generates."""
    return {run.name: run_config(run.name, run.model, run.steps, warmup_steps=min(2000, run.steps // 10))
            for run in runs(study)}


def study_runs(study: str) -> list[str]:
    """Every run a fit of `study` reads: its own and, for trunc, the reused r = 1 runs of plain."""
    s = STUDIES[study]
    reused = [run.name for run in runs(s.reused_r1) if run.r == 1 and run.budget in s.budgets] if s.reused_r1 else []
    return reused + [run.name for run in runs(study)]


def baseline_runs(study: str) -> list[str]:
    """The runs a case study is compared with: its baseline study's at the case study's budgets."""
    s = STUDIES[study]
    if s.baseline is None:
        raise ValueError(f"phi study {study!r} is not a case study (case studies: "
                         f"{', '.join(k for k, v in STUDIES.items() if v.baseline)})")
    return [run.name for run in runs(s.baseline) if run.budget in s.budgets]


def group_patterns(study: str, baseline: bool = False) -> list[str]:
    """Glob patterns over run names (prefix a runs directory) matching exactly `study_runs(study)`, or
    with `baseline` `baseline_runs(study)`: for `rgpt-eval phi --group NAME=PATTERN,...`."""
    s = STUDIES[study]
    if baseline:
        baseline_runs(study)  # refuses a study without a baseline
        return [f"phi-{s.baseline}-*-c{budget}" for budget in s.budgets]
    reused = [f"phi-{s.reused_r1}-r1-*-c{budget}" for budget in s.budgets] if s.reused_r1 else []
    return [f"phi-{study}-*", *reused]


def all_configs() -> dict[str, dict[str, Any]]:
    """Every generated run's config, in task order."""
    return {name: config for study in STUDIES for name, config in sweep(study).items()}


def write_yaml(directory: str | Path) -> list[Path]:
    by_name = {run.name: run for run in runs()}

    def header(name: str) -> str:
        run = by_name[name]
        return (f"# Looped scaling law sweep run {name}: generated from rgpt_dist/studies/phi/grid.py\n"
                f"# (`rgpt study phi grid`). Study {run.study}, r={run.r}, width {run.width}, budget C="
                f"{BUDGETS[run.budget]:.3g} training FLOPs;\n"
                f"# {run.steps} steps x {TOKENS_PER_STEP} tokens x {run.train_flops_per_token:.6g} FLOPs/token = "
                f"{run.achieved:.6g} ({run.achieved / BUDGETS[run.budget] - 1:+.3%}).\n"
                "# Prepare data/pretrain with rgpt-prep --seq-len 1024; the main grid's recipe.\n")
    return write_configs(directory, all_configs(), header)


PEAK_FLOPS, MFU, GPUS_PER_NODE = 989e12, 0.4, 8
"""slurm/phi_grid.sh's cost assumptions: H100/H200 dense bf16 peak, 40% MFU, 8 GPUs per node."""


def gpu_hours(names: list[str] | None = None) -> float:
    """GPU-hours of the named runs (None: all) by rgpt_dist.flops.gpu_hours at PEAK_FLOPS x MFU."""
    wanted = None if names is None else set(names)
    chosen = [run for run in runs() if wanted is None or run.name in wanted]
    return sum(flops_gpu_hours(model_config(run.model), SEQ_LEN, run.steps, TOKENS_PER_STEP, PEAK_FLOPS, MFU)
               for run in chosen)


def slurm_script() -> str:
    """slurm/phi_grid.sh (regenerate it after changing the sweep: `rgpt study phi grid`)."""
    names = [run.name for run in runs()]
    first = {study: names.index(runs(study)[0].name) for study in STUDIES}
    trunc = f"{first['trunc']}-{first['trunc'] + len(runs('trunc')) - 1}"
    costs = "\n".join(f"#   {study:<7} tasks {first[study]:>3}-{first[study] + len(runs(study)) - 1:<3} "
                      f"{len(runs(study)):>3} runs  {gpu_hours([r.name for r in runs(study)]):>7,.0f} GPU-hours"
                      for study in STUDIES)
    longest = max(runs(), key=lambda run: run.achieved)
    node_hours = gpu_hours([longest.name]) / GPUS_PER_NODE
    table = "\n".join(f"#  {i:>3}  {name}" for i, name in enumerate(names))
    return f"""#!/bin/bash
# The looped scaling law's iso-depth sweep (rgpt_dist/studies/phi/grid.py, generated by
# `rgpt study phi grid`): one array task per run, whole experiment names (configs/experiments/phi/<name>.yaml).
#   mkdir -p logs && sbatch slurm/phi_grid.sh                  # every run
#   sbatch --array={trunc} slurm/phi_grid.sh             # one study: the trunc case study (ranges below)
# Every setting and environment override: docs/cluster.md. Shared logic: slurm/common.sh.
# Cost (rgpt_dist.flops.gpu_hours: training FLOPs / ({PEAK_FLOPS / 1e12:g} TFLOP/s x {MFU:.0%} MFU); evaluation,
# checkpoints and restarts not included):
{costs}
#   total           {len(names)} runs  {gpu_hours():>7,.0f} GPU-hours
# The longest task ({longest.name}) needs about {node_hours:.1f} node-hours of {GPUS_PER_NODE} GPUs
# at {MFU:.0%} MFU; a task that reaches --time requeues itself and resumes from its checkpoint.
#SBATCH --job-name=rgpt-phi
#SBATCH --array=0-{len(names) - 1}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-gpu=8
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%A_%a.out

# Array task ids (study by study, budget, width, r; the trunc study's r = 1 runs are plain's):
{table}
# shellcheck disable=SC2034  # read by common.sh
BUDGETED=0  # whole experiment names: configs/experiments/phi/<name>.yaml
# shellcheck disable=SC2034
CONFIG_SUBDIR=phi
# shellcheck disable=SC2034
MODELS=(
{chr(10).join('    ' + ' '.join(names[i:i + 4]) for i in range(0, len(names), 4))})
# shellcheck source-path=SCRIPTDIR source=common.sh
source "${{RGPT_ROOT:-${{SLURM_SUBMIT_DIR:-.}}}}/slurm/common.sh"
"""


def study_groups(runs: list[str], specs: list[str], study: str) -> dict[str, list[str]]:
    """The case study's runs (its r = 1 runs borrowed from its baseline where they are the same run)
    and its baseline's at the case study's budgets, under the runs directory RUNS."""
    cases = [name for name, s in STUDIES.items() if s.baseline]
    if study not in cases:
        raise PhiInputError(f"--study {study!r}: the sweep's case studies are {', '.join(cases)}")
    if specs or len(runs) != 1:
        raise PhiInputError(f"--study {study} takes exactly one runs directory (the sweep's), and no --group")
    root = glob.escape(runs[0])  # a literal directory; only the sweep's patterns are globs
    return {name: expand(name, [f"{root}/{p}" for p in group_patterns(study, baseline=base)])
            for name, base in ((study, False), (STUDIES[study].baseline, True))}


CONFIG_DIR = Path("configs") / "experiments" / "phi"
"""Where the sweep's configs live, relative to the checkout (slurm/phi_grid.sh: CONFIG_SUBDIR=phi)."""


def write_grid(root: Path) -> list[Path]:
    """The sweep's configs (root/CONFIG_DIR) and its array script (root/slurm/phi_grid.sh)."""
    written = write_yaml(root / CONFIG_DIR)
    return [*written, write_text(root / "slurm" / "phi_grid.sh", slurm_script())]
