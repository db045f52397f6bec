"""The competitor families under torchrun with gloo, like the existing ones (tests/train/
test_distributed.py): N ranks at every ZeRO stage reproduce one rank, tp=2 x dp=2 reproduces tp=1 x
dp=2, and a SIGKILLed run resumes bitwise. Poisson depth is the hard case: truncated backprop runs
its first r - k steps without autograd."""
from __future__ import annotations

import os
import sys

import pytest

from tests.helpers.dist import ROOT
from tests.helpers.runs import BASE, losses, prepare_dataset, records, train
from tests.train.test_distributed import _kill_after

pytestmark = pytest.mark.slow

# per family: the flavour and its depth settings (Poisson: mean depth 4, gradient through 2 steps;
# RRT: 3 steps with their adapters)
FAMILIES = {"poisson": ["model=poisson-debug", "model.n_loops=4", "model.k_max=2"],
            "relaxed": ["model=rrt-debug", "model.n_loops=3"]}
STAGES_RUN = {"poisson": [0, 1, 3], "relaxed": [3]}
# what makes a run independent of the data-parallel layout (noise keys include the dp rank)
DETERMINISTIC = {"poisson": ["model.state_std=0"], "relaxed": []}
# one vocabulary padding for every layout (it changes the initial weights), divisible by tp = 2
STEPS = ["model.pad_vocab_multiple=256", "train.max_steps=5", "eval.every_steps=5", "checkpoint.every_steps=5"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return prepare_dataset(tmp_path_factory.mktemp("families") / "ds")


def run(nproc, run_dir, dataset, family, *overrides):
    return train(nproc, run_dir, dataset, *FAMILIES[family], *overrides, common=BASE)


@pytest.fixture(scope="module", params=list(FAMILIES))
def one_rank(request, dataset, tmp_path_factory):
    """One process, ZeRO-0, deterministic state: what every data-parallel layout must reproduce."""
    family = request.param
    recs = run(1, tmp_path_factory.mktemp(f"{family}-ref"), dataset, family, "parallel.zero_stage=0",
               *DETERMINISTIC[family], *STEPS)
    return family, recs


@pytest.mark.parametrize("one_rank,stage", [(f, s) for f, stages in STAGES_RUN.items() for s in stages],
                         indirect=["one_rank"])
def test_two_ranks_match_one_rank_at_zero_stages(stage, one_rank, dataset, tmp_path):
    """Poisson at ZeRO 0, 1 and 3 (truncated backprop leaves the first steps without autograd); RRT,
    whose adapters are ordinary parameters, at ZeRO-3 (the suite's time budget); ZeRO-2: below."""
    family, ref = one_rank
    got = run(2, tmp_path, dataset, family, f"parallel.zero_stage={stage}", *DETERMINISTIC[family], *STEPS)
    assert [r["r"] for r in got if "loss" in r] == [r["r"] for r in ref if "loss" in r]
    depths = [r["r"] for r in ref if "loss" in r]
    if family == "poisson":
        assert max(depths) > 2, f"no step truncated its backprop: depths {depths}"  # k_max = 2
    assert [s for s, _ in losses(got)] == [1, 2, 3, 4, 5]
    for (_, a), (_, b) in zip(losses(got), losses(ref)):
        assert a == pytest.approx(b, rel=2e-5)
    assert losses(ref)[-1][1] < losses(ref)[0][1]  # it learns


def test_tp2_x_dp2_at_zero2_matches_one_rank(one_rank, dataset, tmp_path):
    """Megatron layers for the family's own modules (Poisson's adapter halves are row-parallel on
    replicated inputs; RRT's LoRA takes its projection's split); with the layout-independent
    settings every layout is comparable to one rank."""
    family, ref = one_rank
    got = run(4, tmp_path, dataset, family, "parallel.tp_size=2", "parallel.zero_stage=2", *DETERMINISTIC[family],
              *STEPS)
    assert [s for s, _ in losses(got)] == [1, 2, 3, 4, 5]
    for (_, a), (_, b) in zip(losses(got), losses(ref)):
        assert a == pytest.approx(b, rel=2e-5)


@pytest.mark.parametrize("family", ["poisson"])  # truncated backprop at ZeRO-3: the new resume risk
def test_sigkill_and_restart_is_bitwise(family, dataset, tmp_path):
    args = ["parallel.zero_stage=3", "train.max_steps=8", "checkpoint.every_steps=3", "eval.every_steps=0"]
    full = losses(run(2, tmp_path / "full", dataset, family, *args))
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "launcher.train",
           "configs/experiments/quickstart.yaml", *BASE, *FAMILIES[family], f"data.paths=[{dataset}]",
           f"log.run_dir={killed}", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".venv" / "torch_extensions"))}
    _kill_after(killed, 5, cmd, env)
    assert 5 <= len(losses(records(killed))) < 8, "the run was not interrupted mid-training"
    assert losses(run(2, killed, dataset, family, *args)) == full  # bitwise
