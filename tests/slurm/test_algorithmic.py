"""slurm/algorithmic.sh, statically and by dry run (RGPT_DRY_RUN=1): the array covers its studies'
tasks x models x seeds exactly (the RLT paper's grid: the five RLT-1 splits and the Transformer on six
tasks, RLT-0 and RLT-2 at every split, the sixteen-layer parity study), each task id maps to its
(task, model, seed) run of `rgpt-algo train` then `rgpt-algo eval` of the best and the last
checkpoint, the job asks for CPUs only (the paper's CPU FP32 runs, 4 threads), and bad ids are
refused. `sbatch --test-only` on the local cluster: tests/slurm/test_slurm.py."""
import itertools
import os
import re
import shlex
import subprocess

import pytest
import yaml

from rgpt_dist.algorithmic import TASKS
from rgpt_dist.config import FLAVOURS, load_config
from rgpt_dist.flops import param_count
from tests.helpers.dist import ROOT
from tests.slurm.test_scripts import SHELLCHECK

SCRIPT = ROOT / "slurm" / "algorithmic.sh"


STUDIES = ("main", "variants", "sixteen")


def _list(name):
    """A bash array of the script, its words expanded by bash itself (the lists use expansions)."""
    block = f'source <(sed -n "/^STUDIES=/,/^}}/p" {SCRIPT})'               # STUDIES= ... the lists' closing }
    done = subprocess.run(["bash", "-c", f'{block}; printf "%s\\n" "${{{name}[@]}}"'], capture_output=True, text=True,
                          check=True)
    return done.stdout.split()


def _grid():
    """(study, task, model, seed, overrides) in array order, from the script's lists."""
    out = []
    for study in _list("STUDIES"):
        p = study.upper()
        for task, model, seed in itertools.product(_list(f"{p}_TASKS"), _list(f"{p}_MODELS"), _list(f"{p}_SEEDS")):
            out.append((study, task, model, seed, _list(f"{p}_OVERRIDES")))
    return out


def _run(*args, **env):
    full = {**os.environ, "RGPT_DRY_RUN": "1", "SLURM_JOB_ID": "77", "SLURM_SUBMIT_DIR": str(ROOT), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, cwd="/")


def test_syntax_and_shellcheck():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    assert SHELLCHECK is not None
    done = subprocess.run([SHELLCHECK, "-x", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_the_array_is_the_papers_grid_on_cpus_only():
    splits = ["4+4", "5+3", "6+2", "7+1", "8+0"]
    assert tuple(_list("STUDIES")) == STUDIES
    assert sorted(_list("MAIN_TASKS")) == sorted(TASKS) == sorted(_list("VARIANTS_TASKS"))
    assert _list("MAIN_MODELS") == [f"rlt1-{s}" for s in splits] + ["rlt-transformer-8"]
    assert _list("VARIANTS_MODELS") == [f"rlt{v}-{s}" for v in (0, 2) for s in splits]
    assert _list("SIXTEEN_MODELS") == [f"rlt1-{e}+{16 - e}" for e in range(8, 17)] + ["rlt-transformer-16"]
    assert _list("MAIN_SEEDS") == _list("VARIANTS_SEEDS") == ["42", "43", "44"] and _list("SIXTEEN_SEEDS") == ["42"]
    assert _list("SIXTEEN_TASKS") == ["parity"] and _list("SIXTEEN_OVERRIDES") == ["train.global_batch_size=1024"]
    assert _list("MAIN_OVERRIDES") == _list("VARIANTS_OVERRIDES") == []
    grid = _grid()
    assert len(grid) == 6 * 6 * 3 + 6 * 10 * 3 + 10 == 298
    assert all(model in FLAVOURS for _, _, model, _, _ in grid)
    for split in splits:   # J.9: RLT-0 has 787,968 fewer parameters than RLT-1 at every split, RLT-2 the same
        n1, n0, n2 = (param_count(load_config(f"rlt{v}-{split}").model) for v in (1, 0, 2))
        assert (n1 - n0, n2) == (787_968, n1)
        assert FLAVOURS[f"rlt0-{split}"]["feedback_interval"] == 0 and FLAVOURS[f"rlt2-{split}"]["feedback_interval"] == 4
        assert {k: v for k, v in FLAVOURS[f"rlt2-{split}"].items() if k != "feedback_interval"} == {
            k: v for k, v in FLAVOURS[f"rlt1-{split}"].items() if k != "feedback_interval"}
    header = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", SCRIPT.read_text(), re.M))
    assert header["array"] == f"0-{len(grid) - 1}"
    assert header["cpus-per-task"] == "4" and "export OMP_NUM_THREADS=4" in SCRIPT.read_text()
    assert not any(k.startswith(("gres", "gpus")) or k.endswith("gpu") for k in header), header
    assert "requeue" in header and header["signal"] == "B:USR1@120"
    steps = {t: yaml.safe_load((ROOT / "configs" / "algorithmic" / f"{t}.yaml").read_text())["train"]["max_steps"]
             for t in TASKS}
    assert steps == {t: 5000 if t.startswith("mod5") else 2000 for t in TASKS}     # section 3.1, J.10


def test_every_task_id_runs_its_train_then_both_evals():
    grid = _grid()
    for i in [*range(0, 4), 105, 107, 108, 109, 200, 287, 288, 297]:
        study, task, model, seed, overrides = grid[i]
        done = _run(SLURM_ARRAY_TASK_ID=str(i), RGPT_OVERRIDES="train.max_steps=10 log.name=*")
        assert done.returncode == 0, done.stderr
        assert f"task {i} (restart 0): {study} {task} {model} seed {seed}" in done.stdout
        train, best, last = (shlex.split(line) for line in done.stdout.splitlines()[-3:])
        run = f"{ROOT}/runs/algorithmic/{task}-{model}-s{seed}"
        assert train[1:] == [f"{ROOT}/launcher/algo.py", "train", task, "--model", model, "--seed", seed, "--out", run,
                             "--nproc", "1", "checkpoint.requeue=false", *overrides, "train.max_steps=10", "log.name=*"]
        assert best[1:] == [f"{ROOT}/launcher/algo.py", "eval", run]
        assert last[1:] == [f"{ROOT}/launcher/algo.py", "eval", run, "--checkpoint", "last"]
        assert (ROOT / "configs" / "algorithmic" / f"{task}.yaml").is_file()
    assert {g[0] for g in (grid[0], grid[108], grid[297])} == set(STUDIES)
    assert len({(t, m, s) for _, t, m, s, _ in grid}) == len(grid)          # no two runs share a directory


def test_every_run_of_the_grid_passes_config_validation_and_preflight():
    """What `rgpt-algo train` checks before starting a process, for each distinct (task, model,
    study overrides) of the array: a flavour that cannot train a task fails here, not on the cluster."""
    from rgpt_dist.train.preflight import preflight

    runs = {(task, model, tuple(overrides)) for _, task, model, _, overrides in _grid()}
    assert len(runs) == 6 * 6 + 6 * 10 + 10
    for task, model, overrides in sorted(runs):
        cfg = load_config(ROOT / "configs" / "algorithmic" / f"{task}.yaml",
                          [f"model={model}", "log.run_dir=/nonexistent/run", "checkpoint.requeue=false", *overrides])
        assert preflight(cfg, 1) == [], (task, model)
        assert cfg.data.task == task and cfg.model.family in ("rlt", "gpt2")


def test_list_and_study_ranges():
    done = _run("list")
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["main 0-107 (108 runs)", "variants 108-287 (180 runs)",
                                        "sixteen 288-297 (10 runs)", "all 0-297 (298 runs)"]
    done = _run("submit", "main", "sixteen")
    assert done.returncode == 0 and "--array=0-107,288-297 " in done.stdout
    done = _run("submit", "mian")
    assert done.returncode == 2 and "unknown study mian (one of main variants sixteen)" in done.stderr
    assert "sbatch" not in done.stdout


@pytest.mark.parametrize("env, message", [({"SLURM_ARRAY_TASK_ID": "298"}, "the grid has 298 runs (main 0-107, "
                                                                           "variants 108-287, sixteen 288-297)"),
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
    assert "--array=0-297 " in done.stdout
    assert "--dependency=afterany:JOB --array=0 --export=ALL,STAGE=table" in done.stdout
