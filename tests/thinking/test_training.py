"""The thinking model through the project's trainer (rgpt_dist/thinking/loader.py, trainable.py,
spec.py): two ranks at ZeRO-3 reproduce one rank (losses, gradient norms, every consolidated weight),
a SIGKILLed run resumes bitwise, and `rgpt-think frontier` scores the trained checkpoint as a direct
forward over the task's buckets does. A tiny graph model (width 16), dropout off (two ranks draw other
dropout masks than one)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rgpt_dist.checkpoints.consolidate import consolidate
from rgpt_dist.thinking.cli import main as think
from rgpt_dist.thinking.inputs import collate
from rgpt_dist.thinking.tasks import TASKS, bucket
from tests.helpers.dist import torchrun
from tests.helpers.runs import records, trajectory
from tests.train.test_distributed import kill_and_restart

pytestmark = pytest.mark.slow
CONFIG = "configs/thinking/graph.yaml"
STEPS = 6
ARGS = ["model=thinking-graph-debug", "model.d_model=16", "model.d_ff=32", "model.dropout=0", f"train.max_steps={STEPS}",
        "train.micro_batch_size=8", "train.global_batch_size=16", "train.lr=3e-3", "eval.every_steps=3",
        "checkpoint.every_steps=2", "checkpoint.keep_last=3", "log.every_steps=1", "log.wandb=disabled"]
# two ranks against one (2026-12-03, fp32, 6 steps of lr 3e-3; ZeRO-3 and ZeRO-2 against ZeRO-0): losses
# within 4.2e-8 relative, gradient norms 4.3e-8, consolidated weights equal (the two micro-batches'
# gradients are summed in either order: a float32 sum of two is exact both ways). A gradient missing or
# scaled on a partition would move weights by ~lr per step.
LOSS_REL, NORM_REL, WEIGHT_ATOL = 1e-6, 1e-6, 1e-6


def run(nproc, run_dir, *extra):
    return torchrun("launcher.train", nproc, CONFIG, *ARGS, f"log.run_dir={run_dir}", *extra, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("thinking")
    # the ZeRO-3 run also recomputes each thinking step in backward (activation checkpointing: under
    # ZeRO-3 the recomputation gathers the block's parameters again)
    layouts = {"one": (1, 0, "none"), "zero3": (2, 3, "recurrence"), "zero2": (2, 2, "none")}
    for name, (nproc, stage, recompute) in layouts.items():
        run(nproc, root / name, f"parallel.zero_stage={stage}", f"parallel.activation_checkpointing={recompute}")
    return {name: root / name for name in layouts}


@pytest.mark.parametrize("layout", ["zero3", "zero2"])
def test_two_ranks_reproduce_one_rank(runs, layout):
    (got, val), (ref, val_ref) = trajectory(records(runs[layout])), trajectory(records(runs["one"]))
    assert [(s, r) for s, r, *_ in got] == [(s, r) for s, r, *_ in ref] and len(ref) == STEPS
    assert len({r for _, r, *_ in ref}) > 1  # the sampler drew several step counts (U[5, 8])
    for (step, _, loss, norm, *_), (_, _, loss_ref, norm_ref, *_) in zip(got, ref):
        assert norm_ref > 0
        assert loss == pytest.approx(loss_ref, rel=LOSS_REL), ("loss", step)
        assert norm == pytest.approx(norm_ref, rel=NORM_REL), ("grad_norm", step)
    for (step, v, curve), (_, v_ref, curve_ref) in zip(val, val_ref):  # the early-exit curve: steps 0..8
        assert v == pytest.approx(v_ref, rel=LOSS_REL) and len(curve) == 9
        assert curve == pytest.approx(curve_ref, rel=LOSS_REL), ("early_exit", step)
    accuracy = [r["val_accuracy"] for r in records(runs[layout]) if "val_loss" in r]  # mean of batch means
    assert accuracy == pytest.approx([r["val_accuracy"] for r in records(runs["one"]) if "val_loss" in r], abs=1e-12)
    assert len(accuracy) == 2 and all(a * 320 == pytest.approx(round(a * 320)) for a in accuracy)  # 320 examples
    a, b = consolidate(runs["one"]), consolidate(runs[layout])
    assert a.step == b.step == STEPS and set(a.state_dict) == set(b.state_dict)
    assert (a.state_dict["core.gate_proj.bias"] + 2).abs().max() > 1e-3  # trained off the init (-2)
    for name in a.state_dict:
        torch.testing.assert_close(b.state_dict[name], a.state_dict[name], rtol=0, atol=WEIGHT_ATOL, msg=name)


def test_sigkill_and_restart_is_bitwise(runs, tmp_path):
    killed = tmp_path / "killed"
    extra = ["parallel.zero_stage=2"]
    cmd = [CONFIG, *ARGS, f"log.run_dir={killed}", *extra]
    resume_at, logged = kill_and_restart(killed, 3, cmd, lambda: run(2, killed, *extra))
    assert 3 <= logged < STEPS and resume_at in (2, 4), "the run was not interrupted mid-training"
    assert trajectory(records(killed)) == trajectory(records(runs["zero2"]))
    a, b = consolidate(runs["zero2"]), consolidate(killed)
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)


def test_the_frontier_scores_the_checkpoint_as_a_direct_forward(runs, tmp_path, capsys):
    out = tmp_path / "frontier"
    assert think(["frontier", str(runs["one"]), "--difficulties", "1,3", "--steps", "1,2,5", "--n", "10",
                  "--batch-size", "4", "--out", str(out)]) == 0
    result = json.loads((out / "frontier.json").read_text())
    assert (result["difficulties"], result["steps"], result["n"], result["step"]) == ([1, 3], [1, 2, 5], 10, STEPS)
    assert (out / "frontier.png").stat().st_size > 0 and "| 3 | " in (out / "frontier.md").read_text()
    from rgpt_dist.registry import build_model
    c = consolidate(runs["one"])
    model = build_model(c.config.model)
    model.load_state_dict(c.state_dict)
    model.eval()
    task = TASKS["graph"]
    for i, d in enumerate([1, 3]):
        x = collate(task, bucket(task, "test", d, 10), task.max_len)
        with torch.no_grad():
            expected = [((model.logits(x, s) > 0).long() == x.labels).double().mean().item() for s in (1, 2, 5)]
        assert np.allclose(result["accuracy"][i], expected, atol=0, rtol=0)


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "thinking steps [0] must be integers in 1..model.max_steps=20"),
    (["--steps", "21"], "thinking steps [21] must be integers in 1..model.max_steps=20"),
    (["--difficulties", "13"], "difficulty 13 is outside its range 1..12"),
    (["--n", "3"], "bucket size n=3 must be a positive even integer"),
])
def test_bad_frontier_input_exits_2_before_loading(runs, argv, message, capsys, tmp_path):
    assert think(["frontier", str(runs["one"]), *argv, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "x").exists()
