"""slurm/thinking.sh (the silent-thinking study's array over slurm/studies.sh), by dry run
(RGPT_DRY_RUN=1): every id maps to its (task, model, seed, supervision) run of `rgpt-think train`
then `rgpt-think frontier`, every run passes config validation and preflight, bad ids are refused.
`sbatch --test-only` on the local cluster: tests/slurm/test_slurm.py."""
import os
import shlex
import subprocess

import pytest

from rgpt_dist.config import load_config
from rgpt_dist.train.preflight import preflight
from tests.helpers.dist import ROOT
from tests.slurm.test_scripts import SHELLCHECK

SCRIPT = ROOT / "slurm" / "thinking.sh"
ALPHAS = ("0.10", "0.25", "0.50", "0.75", "0.90", "1.00")
# the array in order: per task its model and baseline x 3 seeds, then the graph sweep over a
GRID = [(t, m, s, None) for t in ("graph", "logic", "relational") for m in (f"thinking-{t}", f"thinking-{t}-fixed")
        for s in (42, 43, 44)] + [("graph", "thinking-graph", s, a) for a in ALPHAS for s in (42, 43, 44)]


def _run(*args, **env):
    full = {**os.environ, "RGPT_DRY_RUN": "1", "SLURM_JOB_ID": "77", "SLURM_SUBMIT_DIR": str(ROOT), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, cwd="/")


def test_syntax_and_shellcheck():
    for script in (SCRIPT, ROOT / "slurm" / "studies.sh"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
        done = subprocess.run([SHELLCHECK, "-x", str(script)], capture_output=True, text=True, cwd=ROOT / "slurm")
        assert done.returncode == 0, done.stdout


def test_every_id_trains_its_run_then_writes_its_frontier():
    assert "#SBATCH --array=0-35" in SCRIPT.read_text() and "gpus" not in SCRIPT.read_text()
    for i, (task, model, seed, alpha) in enumerate(GRID):
        done = _run(SLURM_ARRAY_TASK_ID=str(i))
        assert done.returncode == 0, done.stderr
        train, front = [shlex.split(line) for line in done.stdout.splitlines()[1:3]]
        run = ROOT / "runs" / "thinking" / f"{task}-{model}{'' if alpha is None else f'-a{alpha}'}-s{seed}"
        assert train[1:] == [str(ROOT / "launcher/think.py"), "train", task, "--model", model, "--seed", str(seed),
                             "--out", str(run), "--nproc", "1", "checkpoint.requeue=false",
                             *([] if alpha is None else [f"model.supervision_alpha={alpha}"])]
        assert front[1:] == [str(ROOT / "launcher/think.py"), "frontier", str(run)]
    done = _run(SLURM_ARRAY_TASK_ID=str(len(GRID)))
    assert done.returncode == 2 and "the grid has 36 runs" in done.stderr


@pytest.mark.parametrize("i", [0, 3, 8, 13, 20, 35])
def test_runs_pass_validation_and_preflight(i):
    task, model, seed, alpha = GRID[i]
    cfg = load_config(ROOT / "configs" / "thinking" / f"{task}.yaml",
                      [f"model={model}", f"train.seed={seed}", *([] if alpha is None else [f"model.supervision_alpha={alpha}"])])
    assert preflight(cfg, 1) == [] and cfg.model.supervision_alpha == float(alpha or 0)
    assert cfg.model.fixed_layers == (0 if not model.endswith("fixed") else {"graph": 6, "logic": 8, "relational": 5}[task])


def test_list_and_table_stage():
    done = _run("list")
    assert done.returncode == 0 and "graph 0-5 (6 runs)" in done.stdout and "sup100 33-35 (3 runs)" in done.stdout
    done = _run(STAGE="table")
    assert done.returncode == 0
    assert shlex.split(done.stdout.splitlines()[-1])[1:] == [str(ROOT / "launcher/think.py"), "table",
                                                             str(ROOT / "runs/thinking"), "--out",
                                                             str(ROOT / "runs/thinking/table")]
