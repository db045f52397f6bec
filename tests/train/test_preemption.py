"""SIGUSR1 (SLURM's warning signal) or SIGTERM: every rank finishes the same step, that step is saved,
the run exits with status 75, and rerunning resumes from that step with no lost or repeated step.
One uninterrupted run is the reference of every test here."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rgpt_dist.config import load_config
from rgpt_dist.train.optim import lr_at
from tests.helpers.dist import ROOT
from tests.helpers.runs import COMMON, launch, losses, reached, records, resumed_line, train

pytestmark = pytest.mark.slow

ARGS = ["parallel.zero_stage=2", "train.max_steps=30", "checkpoint.every_steps=100", "eval.every_steps=0"]
WANDB = ["log.wandb=offline"]


@pytest.fixture(scope="module")
def uninterrupted(dataset, tmp_path_factory):
    """(run directory, losses) of the run every interrupted one must reproduce (copy it before use)."""
    run = tmp_path_factory.mktemp("full")
    return run, losses(train(2, run, dataset, *ARGS))


def _signal_at_step(run_dir, dataset, step: int, target: str, overrides=(), env=None) -> tuple[int, str]:
    """Start the run under torchrun (forwarding SIGUSR1 to its workers, as slurm/ scripts do); when
    `step` is logged send SIGUSR1 to the torchrun agent (`agent`) or to rank 1's worker only
    (`rank1`), or SIGTERM to both workers (`sigterm`). Returns (torchrun's exit status, its output)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "--shutdown-timeout=120",
           "-m", "launcher.train", "configs/experiments/quickstart.yaml", *COMMON, f"data.paths=[{dataset}]",
           f"log.run_dir={run_dir}", *ARGS, *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".venv" / "torch_extensions")),
           **(env or {})}
    env.pop("SLURM_JOB_ID", None)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if reached(run_dir, step):
            break
        time.sleep(0.02)
    workers = sorted(psutil.Process(proc.pid).children(), key=lambda p: int(p.environ().get("RANK", 0)))
    assert len(workers) == 2, workers
    if target == "agent":
        proc.send_signal(signal.SIGUSR1)
    elif target == "rank1":
        workers[1].send_signal(signal.SIGUSR1)
    else:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=300)[0]
    return proc.returncode, output


def _worker_statuses(output: str) -> list[str]:
    """The workers' exit statuses in torchrun's failure summary (`exitcode  : 75`)."""
    return re.findall(r"exitcode +: (-?\d+)", output)


@pytest.mark.parametrize("target", ["agent", "rank1", "sigterm"])
def test_signal_saves_the_step_and_the_rerun_resumes_exactly(target, dataset, uninterrupted, tmp_path):
    """docs/training.md "Stopping on a signal": SIGUSR1 to torchrun (forwarded to both ranks), to one
    rank only, or SIGTERM to both ranks (what a scheduler's cancellation or preemption sends): both
    ranks stop after the same step, save it and exit with status 75; the rerun resumes from exactly
    that step and reproduces the uninterrupted run bitwise, every step logged once. Under the agent
    signal torchrun itself dies of the signal and reports no worker status: there the workers must
    have stopped on their own (torchrun did not have to kill them) after printing the resume hint.
    The SIGTERM run logs to wandb offline: the rerun continues the same wandb run id
    (rgpt_dist/train/metrics.py `_wandb_run_id`: "a resumed or requeued job continues the same wandb
    run"), one offline run directory per launch."""
    env = {"WANDB_MODE": "offline"} if target == "sigterm" else None
    extra = WANDB if target == "sigterm" else []
    status, output = _signal_at_step(tmp_path, dataset, 3, target, extra, env)
    partial = losses(records(tmp_path))
    stopped = partial[-1][0]
    assert status != 0, output[-3000:]
    assert 3 <= stopped < 30, "the signal did not stop the run early"
    assert f"step {stopped:6d} | stop requested (" in output
    assert (tmp_path / "checkpoints" / "latest").read_text() == f"step_{stopped:08d}"
    assert "not under SLURM: rerun the same command to resume" in output, output[-3000:]  # rank 0, before exit 75
    if target == "agent":
        assert not _worker_statuses(output), output[-3000:]
        assert "forcefully exiting" not in output and "Unable to shutdown process" not in output, output[-3000:]
    else:
        assert _worker_statuses(output) == ["75", "75"], output[-3000:]  # both ranks, EX_TEMPFAIL
    resumed = launch(2, tmp_path, dataset, *ARGS, *extra, env=env)
    assert resumed_line(tmp_path, stopped) in resumed, resumed[-3000:]
    got = losses(records(tmp_path))
    assert [s for s, _ in got] == list(range(1, 31))  # every step exactly once
    assert got == uninterrupted[1]  # bitwise: nothing lost, repeated or perturbed
    if target == "sigterm":
        run_id = (tmp_path / "wandb_run_id").read_text()
        runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
        assert len(runs) == 2 and all(r.name.endswith(f"-{run_id}") for r in runs), (run_id, runs)
        assert all((r / f"run-{run_id}.wandb").is_file() for r in runs)


def test_a_checkpoint_resumes_only_the_run_that_wrote_it(dataset, uninterrupted, tmp_path):
    """docs/training.md: another model, seed or precision in the same run directory is refused, naming every
    difference, instead of silently continuing the old run (nothing trained, nothing written); a
    longer budget (the doubled-budget case) continues it from its last step."""
    run = tmp_path / "run"
    shutil.copytree(uninterrupted[0], run)
    before, config = (run / "metrics.jsonl").read_text(), (run / "config.yaml").read_text()
    longer = [*ARGS, "train.max_steps=32"]
    with pytest.raises(AssertionError, match="belongs to a different run") as e:
        train(2, run, dataset, *longer, "model.n_loops=3", "train.seed=7", "parallel.dtype=bf16")
    assert "model.n_loops: checkpoint 4, config 3" in str(e.value) and "train.seed: checkpoint" in str(e.value)
    assert "parallel.dtype: checkpoint 'fp32', config 'bf16'" in str(e.value)
    assert (run / "metrics.jsonl").read_text() == before and (run / "config.yaml").read_text() == config
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_00000030"]
    output = launch(2, run, dataset, *longer, "train.lr=2e-4", "train.min_lr=2e-5")  # and a lower peak lr
    assert resumed_line(run, 30) in output
    got = losses(records(run))
    assert [s for s, _ in got] == list(range(1, 33)) and got[:30] == uninterrupted[1]
    # the new schedule's lr from the first resumed step on, not the checkpoint's peak (optim.apply_config)
    new = load_config(run / "config.yaml").train
    assert (new.lr, new.max_steps) == (2e-4, 32)
    assert [r["lr"] for r in records(run) if r.get("step", 0) > 30 and "lr" in r] == [lr_at(31, new), lr_at(32, new)]
