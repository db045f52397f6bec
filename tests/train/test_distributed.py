"""Training under torchrun with gloo: ZeRO stages, data parallelism vs one process, resumption."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.dist import ROOT
from tests.helpers.runs import COMMON, losses, prepare_dataset, records, train

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return prepare_dataset(tmp_path_factory.mktemp("train") / "ds")


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory):
    """One process, ZeRO-0, noise off: the run every data-parallel layout must reproduce."""
    run = tmp_path_factory.mktemp("ref")
    return losses(train(1, run, dataset, "parallel.zero_stage=0", "model.sigma_x=0", "model.sigma_g=0",
                        "train.max_steps=5", "eval.every_steps=0", "checkpoint.every_steps=5"))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_two_ranks_match_one_rank_at_every_zero_stage(stage, dataset, reference, tmp_path):
    got = losses(train(2, tmp_path, dataset, f"parallel.zero_stage={stage}", "model.sigma_x=0", "model.sigma_g=0",
                       "train.max_steps=5", "eval.every_steps=5", "checkpoint.every_steps=5"))
    assert [s for s, _ in got] == [s for s, _ in reference] == [1, 2, 3, 4, 5]
    for (_, a), (_, b) in zip(got, reference):
        assert a == pytest.approx(b, rel=2e-5)
    assert reference[-1][1] < reference[0][1]  # it learns
    recs = [r for r in records(tmp_path) if "loss" in r]
    assert all(0 < r["mfu"] <= r["hfu"] < 1 for r in recs)  # FLOPs of the depth each step ran
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000005"


def _kill_after(run_dir, step, cmd, env):
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = Path(run_dir) / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and any(json.loads(l).get("step", 0) >= step for l in metrics.read_text().splitlines()):
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("stage,tp", [(0, 1), (3, 1), (2, 2), (3, 2)], ids=["zero0", "zero3", "zero2-tp2", "zero3-tp2"])
def test_sigkill_and_restart_reproduces_the_uninterrupted_losses_bitwise(stage, tp, dataset, tmp_path):
    args = [f"parallel.zero_stage={stage}", "train.max_steps=8", "checkpoint.every_steps=3", "eval.every_steps=0",
            f"parallel.tp_size={tp}", "model.pad_vocab_multiple=256"]
    full = losses(train(2, tmp_path / "full", dataset, *args))
    run = tmp_path / "killed"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "launcher.train",
           "configs/experiments/quickstart.yaml", *COMMON, f"data.paths=[{dataset}]", f"log.run_dir={run}", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".venv" / "torch_extensions"))}
    _kill_after(run, 5, cmd, env)
    partial = losses(records(run))
    assert 5 <= len(partial) < 8, "the run was not interrupted mid-training"
    resumed = losses(train(2, run, dataset, *args))
    assert resumed == full  # bitwise: JSON floats round-trip exactly


@pytest.mark.parametrize("stage", [0, 3])  # 0: our optimizer skips; 1-3: DeepSpeed's ZeRO optimizer does
def test_injected_nan_is_skipped_on_both_ranks_and_too_many_stop_the_run(stage, dataset, tmp_path):
    args = [f"parallel.zero_stage={stage}", "train.max_steps=6", "checkpoint.every_steps=6", "eval.every_steps=0"]
    recs = [r for r in train(2, tmp_path / "a", dataset, *args, env={"RGPT_INJECT_NAN": "2,3@1"}) if "loss" in r]
    skipped = [r["step"] for r in recs if r["skipped"]]
    assert skipped == [3, 4] and recs[-1]["skipped_total"] == 2  # 0-based steps 2 and 3, on rank 1 only
    assert all(r["loss"] is not None for r in recs if not r["skipped"])
    with pytest.raises(AssertionError, match="consecutive steps had non-finite gradients"):
        train(2, tmp_path / "b", dataset, *args, "train.max_nonfinite_steps=2", env={"RGPT_INJECT_NAN": "1,2,3"})
    assert (tmp_path / "b" / "checkpoints" / "latest").read_text() == "step_00000003"


@pytest.mark.parametrize("damage", ["torn", "corrupted"])
def test_a_torn_or_corrupted_newest_checkpoint_is_skipped(damage, dataset, tmp_path):
    args = ["parallel.zero_stage=2", "train.max_steps=6", "checkpoint.every_steps=3", "eval.every_steps=0"]
    full = losses(train(2, tmp_path, dataset, *args))
    newest = tmp_path / "checkpoints" / "step_00000006"
    if damage == "torn":  # killed while writing: the completion record never appeared
        (newest / "checksums.json").unlink()
    else:
        victim = next(p for p in sorted(newest.glob("*.pt")))
        victim.write_bytes(victim.read_bytes()[:-100])
    resumed = losses(train(2, tmp_path, dataset, *args))
    assert resumed == full  # steps 4-6 recomputed from step 3, identically


def test_deepspeed_launcher_and_bf16(dataset, tmp_path):
    """`deepspeed --num_gpus 2 launcher/train.py ...` (it passes --local_rank) with bf16 on CPU."""
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--no_ssh_check",
           str(ROOT / "launcher" / "train.py"), "configs/experiments/quickstart.yaml", *COMMON,
           f"data.paths=[{dataset}]", f"log.run_dir={tmp_path}", "parallel.dtype=bf16", "parallel.zero_stage=3",
           "train.max_steps=3", "eval.every_steps=3", "checkpoint.every_steps=3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
           "DS_ACCELERATOR": "cpu",
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".venv" / "torch_extensions"))}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    recs = records(tmp_path)
    assert [r["step"] for r in recs if "loss" in r] == [1, 2, 3]
    assert all(0 < r["loss"] < 20 for r in recs if "loss" in r) and recs[-1]["val_loss"] > 0


TP = ["model.pad_vocab_multiple=256", "train.max_steps=5", "eval.every_steps=5", "checkpoint.every_steps=5"]


@pytest.fixture(scope="module")
def dp2_reference(dataset, tmp_path_factory):
    """tp = 1 x dp = 2, noise on: what tp = 2 x dp = 2 must reproduce (same replicas, same noise keys)."""
    return losses(train(2, tmp_path_factory.mktemp("dp2"), dataset, "parallel.zero_stage=1", *TP))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_tp2_x_dp2_reproduces_tp1_x_dp2(stage, dataset, dp2_reference, tmp_path):
    got = losses(train(4, tmp_path, dataset, "parallel.tp_size=2", f"parallel.zero_stage={stage}", *TP))
    assert [s for s, _ in got] == [s for s, _ in dp2_reference] == [1, 2, 3, 4, 5]
    for (_, a), (_, b) in zip(got, dp2_reference):
        assert a == pytest.approx(b, rel=1e-5)
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000005"
