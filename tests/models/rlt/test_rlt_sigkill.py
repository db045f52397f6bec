"""RLT killed with SIGKILL mid-training and restarted (issue 25's acceptance: "SIGKILL + restart resumes
bitwise"): the run resumes from its newest complete checkpoint and logs what the uninterrupted run
logged, bitwise (losses, gradient norms, learning rates), and ends with bitwise the same weights. Two
ranks at ZeRO-2, the trained task's own stream (parity, capped to 3..16 bits as `make rlt` trains it, so the
loader's state carries the cap), the decoder's carry detached every 4 positions (truncated BPTT)."""
from __future__ import annotations


import pytest
import torch

from rgpt_dist.checkpoints.consolidate import consolidate
from tests.helpers.runs import records, trajectory
from tests.models.rlt.test_rlt_family import ARGS, CONFIG, launch
from tests.train.test_distributed import kill_and_restart

pytestmark = pytest.mark.slow

EXTRA = ["train.max_steps=8", "checkpoint.every_steps=3", "checkpoint.keep_last=3",
         "data.task_train_max=16", "model.tbptt=4"]


def _weights(run):
    """The newest complete checkpoint's fp32 weights and its step."""
    got = consolidate(run / "checkpoints")
    return got.state_dict, got.step


def test_sigkill_and_restart_is_bitwise(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    launch(2, full, *EXTRA)
    cmd = [CONFIG, *ARGS, *EXTRA, f"log.run_dir={killed}"]
    resume_at, logged = kill_and_restart(killed, 5, cmd, lambda: launch(2, killed, *EXTRA))
    assert 5 <= logged < 8 and resume_at in (3, 6), "the run was not interrupted mid-training"
    assert trajectory(records(killed)) == trajectory(records(full))  # bitwise: JSON floats round-trip
    (a, step_a), (b, step_b) = _weights(full), _weights(killed)
    assert step_a == step_b == 8
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
