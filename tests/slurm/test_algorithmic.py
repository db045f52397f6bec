"""slurm/algorithmic.sh, statically and by dry run (RGPT_DRY_RUN=1): the array covers tasks x models x
seeds exactly, each task id maps to its (task, model, seed) run of `rgpt-algo train` then `rgpt-algo
eval`, the job asks for CPUs only (the paper's CPU FP32 runs, 4 threads), and bad ids are refused."""
import itertools
import os
import re
import shlex
import subprocess

import pytest

from rgpt_dist.algorithmic import TASKS
from rgpt_dist.config import FLAVOURS
from tests.helpers.dist import ROOT
from tests.slurm.test_scripts import SHELLCHECK

SCRIPT = ROOT / "slurm" / "algorithmic.sh"


def _list(name):
    return re.search(rf"^{name}=\((.*)\)$", SCRIPT.read_text(), re.M).group(1).split()


def _run(*args, **env):
    full = {**os.environ, "RGPT_DRY_RUN": "1", "SLURM_JOB_ID": "77", "SLURM_SUBMIT_DIR": str(ROOT), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, cwd="/")


def test_syntax_and_shellcheck():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    assert SHELLCHECK is not None
    done = subprocess.run([SHELLCHECK, "-x", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_the_array_is_the_whole_grid_on_cpus_only():
    tasks, models, seeds = _list("TASKS"), _list("MODELS"), _list("SEEDS")
    assert sorted(tasks) == sorted(TASKS) and seeds == ["42", "43", "44"] and models == ["rlt-transformer-8"]
    assert all(m in FLAVOURS for m in models)
    header = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", SCRIPT.read_text(), re.M))
    assert header["array"] == f"0-{len(tasks) * len(models) * len(seeds) - 1}" == "0-17"
    assert header["cpus-per-task"] == "4" and "export OMP_NUM_THREADS=4" in SCRIPT.read_text()
    assert not any(k.startswith(("gres", "gpus")) or k.endswith("gpu") for k in header), header
    assert "requeue" in header and header["signal"] == "B:USR1@120"


def test_every_task_id_runs_its_train_then_eval():
    tasks, models, seeds = _list("TASKS"), _list("MODELS"), _list("SEEDS")
    for i, (task, model, seed) in enumerate(itertools.product(tasks, models, seeds)):
        done = _run(SLURM_ARRAY_TASK_ID=str(i), RGPT_OVERRIDES="train.max_steps=10 log.name=*")
        assert done.returncode == 0, done.stderr
        train, evaluate = (shlex.split(line) for line in done.stdout.splitlines()[-2:])
        run = f"{ROOT}/runs/algorithmic/{task}-{model}-s{seed}"
        assert train[1:] == [f"{ROOT}/launcher/algo.py", "train", task, "--model", model, "--seed", seed, "--out", run,
                             "--nproc", "1", "checkpoint.requeue=false", "train.max_steps=10", "log.name=*"]
        assert evaluate[1:] == [f"{ROOT}/launcher/algo.py", "eval", run]
        assert (ROOT / "configs" / "algorithmic" / f"{task}.yaml").is_file()


@pytest.mark.parametrize("env, message", [({"SLURM_ARRAY_TASK_ID": "18"}, "the grid has 18 runs"),
                                          ({"SLURM_ARRAY_TASK_ID": "a[$(true)]"}, "is not a decimal job or task id"),
                                          ({"STAGE": "tabel"}, "must be run or table")])
def test_bad_ids_and_stages_are_refused(env, message):
    done = _run(**env)
    assert done.returncode == 2 and message in done.stderr and "algo.py" not in done.stdout


def test_table_stage_and_submission():
    done = _run(STAGE="table")
    assert done.returncode == 0
    assert shlex.split(done.stdout.splitlines()[-1])[1:] == [
        f"{ROOT}/launcher/algo.py", "table", f"{ROOT}/runs/algorithmic", "--out", f"{ROOT}/runs/algorithmic/table"]
    done = _run("submit")
    assert done.returncode == 0
    assert "--array=0-17" in done.stdout and "--dependency=afterany:JOB --array=0 --export=ALL,STAGE=table" in done.stdout
