"""The slurm/ job scripts on a real one-node SLURM cluster (slurmctld + slurmd + munge on localhost),
unmodified except for environment overrides that shrink the models to CPU size."""
import json
import re
import time
from pathlib import Path

import pytest

from tests.helpers.dist import ROOT
from tests.helpers.runs import losses, records
from tests.helpers.slurm import CPU, LocalSlurm, SlurmUnavailable, submit

pytestmark = pytest.mark.slow

SCRIPTS = sorted((ROOT / "slurm").glob("*_*.sh"))
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The local cluster. Skipped only when SLURM cannot be installed here (not root, no apt-get, no
    apt source offering it: tests.helpers.slurm.unavailable) and the tests are not required (as root,
    under CI or with RGPT_REQUIRE_SLURM=1 they are: tests.helpers.slurm.required); a cluster that fails
    to start fails every test using it."""
    try:
        slurm = LocalSlurm.start(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as e:
        pytest.skip(f"no local SLURM cluster: {e}")
    yield slurm
    slurm.stop()


def test_sbatch_test_only_accepts_every_script(cluster):
    """The real headers (8 GPUs, 64 CPUs per node, time, requeue, signal) against a node that
    declares a GPU node's resources."""
    assert len(SCRIPTS) == 7  # the five <scale>_<grid>.sh cells, phi_grid.sh and rt_grid.sh
    for script in SCRIPTS:
        done = cluster.run("sbatch", "--test-only", str(script), cwd=ROOT, check=False)
        assert done.returncode == 0, (script.name, done.stderr)
        assert "to start at" in done.stderr


def test_sbatch_test_only_accepts_the_ablation_array(cluster):
    done = cluster.run("sbatch", "--test-only", str(ROOT / "slurm" / "ablations.sh"), cwd=ROOT, check=False)
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr


def test_sbatch_test_only_accepts_the_thinking_array(cluster):
    """The silent-thinking study's 36 array tasks (CPUs only) and one study's range."""
    for extra in ([], ["--array=18-35"]):
        done = cluster.run("sbatch", "--test-only", *extra, str(ROOT / "slurm" / "thinking.sh"), cwd=ROOT, check=False)
        assert done.returncode == 0 and "to start at" in done.stderr, done.stderr


def test_sbatch_test_only_accepts_the_algorithmic_array(cluster):
    """The RLT paper's grid (298 array tasks, CPUs only) and a study subset as `submit` computes it."""
    for extra in ([], ["--array=0-107,288-297"]):
        done = cluster.run("sbatch", "--test-only", *extra, str(ROOT / "slurm" / "algorithmic.sh"), cwd=ROOT,
                           check=False)
        assert done.returncode == 0 and "to start at" in done.stderr, done.stderr


def test_small_isoflops_array_completes_with_checkpoints_and_metrics(cluster, dataset, tmp_path):
    """Two tasks of the array, the first and the last (the dense baseline and the FLOP-matched MoR,
    which the grid pairs with it): every task trains through the same script, and every model of the
    cell already trains through torchrun in the `make compare` smoke test (tests/studies), so the
    other five tasks (15-30 s each on a slow host) are left out."""
    models = {0: "gpt2-small", 6: "mor-small-isoflops-flopmatched"}
    job = submit(cluster, ROOT / "slurm" / "small_isoflops.sh", tmp_path,
                 [*CPU, "train.max_steps=4", "checkpoint.every_steps=2", "eval.every_steps=4", "eval.batches=2",
                  f"data.paths=[{dataset}]"], f"--array={','.join(map(str, models))}")
    states = cluster.wait(job, timeout=600)
    logs = "\n".join(p.read_text() for p in tmp_path.glob("*.out"))
    assert states == {f"{job}_{i}": "COMPLETED" for i in models}, logs[-3000:]
    for model in models.values():
        run = tmp_path / f"{model}-20k"
        assert (run / "checkpoints" / "latest").read_text() == "step_00000004"
        recs = records(run)
        assert [s for s, _ in losses(recs)] == [1, 2, 3, 4]
        assert recs[-1]["val_loss"] > 0
    assert all("early_exit" in records(tmp_path / f"{m}-20k")[-1] for m in list(models.values())[1:])
    from launcher.eval import main as rgpt_eval  # the grid summary of what the array produced
    assert rgpt_eval(["grid", str(tmp_path), "--out", str(tmp_path / "grid")]) == 0
    rows = json.loads((tmp_path / "grid" / "grid.json").read_text())
    assert sorted(r["status"] for r in rows) == ["finished"] * len(models)
    assert sorted(r["method"] for r in rows) == ["GPT-2", "MoR"]
    matched = next(r for r in rows if r["name"] == "mor-small-isoflops-flopmatched-20k")
    assert matched["dense_run"] == "gpt2-small-20k" and matched["train_ratio_to_dense"] is not None


def test_one_phi_array_task_completes_with_a_checkpoint_and_a_final_val_loss(cluster, dataset, tmp_path):
    """slurm/phi_grid.sh's task for phi-trunc-r8 at the smallest width (Poisson's injection at a fixed
    depth 8, backprop through the last 4 steps) with CPU-sized overrides: 4 steps, every one at depth
    8, a checkpoint at step 4 and the validation loss of the final step."""
    from rgpt_dist.studies.phi.grid import runs

    names = [run.name for run in runs()]
    task = next(i for i, n in enumerate(names) if n.startswith("phi-trunc-r8-"))
    job = submit(cluster, ROOT / "slurm" / "phi_grid.sh", tmp_path,
                 [*CPU, "train.max_steps=4", "checkpoint.every_steps=4", "eval.every_steps=4", "eval.batches=2",
                  f"data.paths=[{dataset}]"], f"--array={task}")
    states = cluster.wait(job, timeout=300)
    logs = "\n".join(p.read_text() for p in tmp_path.glob("*.out"))
    assert states == {f"{job}_{task}": "COMPLETED"}, logs[-3000:]
    run = tmp_path / names[task]
    assert (run / "checkpoints" / "latest").read_text() == "step_00000004"
    recs = records(run)
    assert [s for s, _ in losses(recs)] == [1, 2, 3, 4]
    assert {r["r"] for r in recs if "loss" in r} == {8}
    assert recs[-1]["step"] == 4 and recs[-1]["val_loss"] > 0


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(what)


def test_warning_signal_requeues_and_the_job_resumes_without_lost_steps(cluster, dataset, tmp_path):
    """SIGUSR1 to the batch shell (what --signal=B:USR1@120 sends before the time limit): the ranks
    save the step they finish, the job requeues itself and resumes from it. Every step appears once
    and the losses equal an uninterrupted run of the same array task, bitwise."""
    script = ROOT / "slurm" / "small_isoflops.sh"
    overrides = [*CPU, "train.max_steps=30", "checkpoint.every_steps=100", "eval.every_steps=0", f"data.paths=[{dataset}]"]
    job = submit(cluster, script, tmp_path / "preempted", overrides, "--array=1")
    reference = submit(cluster, script, tmp_path / "reference", overrides, "--array=1")
    metrics = tmp_path / "preempted" / "recurrentgpt-small-isoflops-20k" / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, 300, "training did not start")
    cluster.run("scancel", "--signal=USR1", "--batch", f"{job}_1")
    cluster.wait_requeued(f"{job}_1")
    cluster.start_requeued(f"{job}_1")
    states = {**cluster.wait(f"{job}_1", timeout=600), **cluster.wait(reference, timeout=600)}
    log = next((tmp_path / "preempted").glob("*.out")).read_text()
    assert set(states.values()) == {"COMPLETED"}, (states, log[-3000:], cluster.log_of(job), cluster.log_of(reference))
    [stopped] = map(int, re.findall(r"^step +(\d+) \| stop requested", log, re.M))  # the trainer's line
    assert 3 <= stopped < 30 and f"requeueing job {job}_1" in log and "(restart 1)" in log
    # exactly one resumption, from the checkpoint of that step and at that step (parsed, not a substring:
    # "at step 1" is a prefix of "at step 12")
    resumed = re.findall(r"^resumed from (\S+)/step_(\d{8}) at step (\d+)$", log, re.M)
    assert [(Path(d).name, int(tag), int(at)) for d, tag, at in resumed] == [("checkpoints", stopped, stopped)], resumed
    got = losses(records(metrics.parent))
    assert [s for s, _ in got] == list(range(1, 31))
    assert got == losses(records(tmp_path / "reference" / "recurrentgpt-small-isoflops-20k"))
