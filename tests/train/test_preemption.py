"""SIGUSR1 (SLURM's warning signal) or SIGTERM: every rank finishes the same step, that step is saved,
the run exits with status 75, and rerunning resumes with no lost or repeated step."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.dist import ROOT
from tests.helpers.runs import COMMON, losses, prepare_dataset, records, train

pytestmark = pytest.mark.slow

ARGS = ["parallel.zero_stage=2", "train.max_steps=30", "checkpoint.every_steps=100", "eval.every_steps=0"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return prepare_dataset(tmp_path_factory.mktemp("preempt") / "ds")


@pytest.fixture(scope="module")
def uninterrupted(dataset, tmp_path_factory):
    return losses(train(2, tmp_path_factory.mktemp("full"), dataset, *ARGS))


def _signal_at_step(run_dir, dataset, step: int, target: str) -> tuple[int, list]:
    """Start the run under torchrun (forwarding SIGUSR1 to its workers, as slurm/ scripts do); when
    `step` is logged send SIGUSR1 to the torchrun agent or to rank 1's worker only. Returns
    (torchrun exit status, the workers' exit statuses)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "--shutdown-timeout=120",
           "-m", "launcher.train", "configs/experiments/quickstart.yaml", *COMMON, f"data.paths=[{dataset}]",
           f"log.run_dir={run_dir}", *ARGS]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".venv" / "torch_extensions"))}
    env.pop("SLURM_JOB_ID", None)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics, deadline = Path(run_dir) / "metrics.jsonl", time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and any(json.loads(l).get("step", 0) >= step for l in metrics.read_text().splitlines()):
            break
        time.sleep(0.02)
    workers = sorted(psutil.Process(proc.pid).children(), key=lambda p: int(p.environ().get("RANK", 0)))
    if target == "agent":
        proc.send_signal(signal.SIGUSR1)
    else:
        workers[1].send_signal(signal.SIGUSR1)
    output = proc.communicate(timeout=300)[0]
    return proc.returncode, output


@pytest.mark.parametrize("target", ["agent", "rank1"])
def test_signal_saves_the_step_and_the_rerun_resumes_exactly(target, dataset, uninterrupted, tmp_path):
    status, output = _signal_at_step(tmp_path, dataset, 3, target)
    partial = losses(records(tmp_path))
    stopped = partial[-1][0]
    assert status != 0, output[-3000:]  # the workers exit with 75; torchrun reports a failure
    assert 3 <= stopped < 30, "the signal did not stop the run early"
    assert f"step {stopped:6d} | stop requested (" in output
    assert (tmp_path / "checkpoints" / "latest").read_text() == f"step_{stopped:08d}"
    assert "not under SLURM" in output
    resumed = losses(train(2, tmp_path, dataset, *ARGS))
    assert [s for s, _ in resumed] == list(range(1, 31))  # every step exactly once
    assert resumed == uninterrupted  # bitwise: nothing lost, repeated or perturbed


def test_a_checkpoint_resumes_only_the_run_that_wrote_it(dataset, tmp_path):
    """Another model or seed in the same run directory is refused instead of silently continuing
    the old run; a longer budget (the doubled-budget case) continues it."""
    short = [a for a in ARGS if not a.startswith("train.max_steps")]
    train(1, tmp_path, dataset, *short, "train.max_steps=2", "checkpoint.every_steps=2")
    for changed in ("model.n_loops=3", "train.seed=7"):
        with pytest.raises(AssertionError, match="belongs to a different run") as e:
            train(1, tmp_path, dataset, *short, "train.max_steps=3", changed)
        assert changed.split("=")[0] in str(e.value)
    assert [s for s, _ in losses(train(1, tmp_path, dataset, *short, "train.max_steps=3"))] == [1, 2, 3]
