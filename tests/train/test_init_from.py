"""checkpoint.init_from (issue #29): Ouro's stage II starts from a stage-I run's weights through the
trainer, trains only the exit gate (2 ranks, ZeRO-2), and a source holding another model is refused
before anything trains; a run that has its own checkpoint resumes from it and no longer needs the
source."""
from __future__ import annotations

import shutil

import pytest

from rgpt_dist.checkpoints.consolidate import consolidate
from tests.helpers.runs import BASE, launch, records

pytestmark = pytest.mark.slow

OURO = ["model=ouro-debug", "model.n_loops=3", "train.max_steps=2", "eval.every_steps=2", "checkpoint.every_steps=2",
        "eval.batches=2"]


@pytest.fixture(scope="module")
def stage1(dataset, tmp_path_factory):
    run = tmp_path_factory.mktemp("stage1")
    launch(1, run, dataset, *OURO, common=BASE)
    return run


def test_the_gate_stage_starts_from_stage_one_and_trains_only_the_gate(stage1, dataset, tmp_path):
    run = tmp_path / "stage2"
    gate_stage = [*OURO, "model.stage=gate", f"checkpoint.init_from={stage1}", "parallel.zero_stage=2"]
    said = launch(2, run, dataset, *gate_stage, common=BASE)
    assert f"weights from {stage1}" in said
    assert [r["step"] for r in records(run) if "loss" in r] == [1, 2]
    before, after = consolidate(stage1).state_dict, consolidate(run).state_dict
    assert before.keys() == after.keys()
    gate = [k for k in before if k.startswith("exits.gate.")]
    assert gate, sorted(before)
    moved = [k for k in before if not after[k].equal(before[k])]
    assert moved and set(moved) <= set(gate)  # the gate trained, every other weight is stage I's, bitwise
    # its own checkpoint now: a restart resumes from it and no longer reads (or needs) the source
    moved_away = tmp_path / "elsewhere"
    shutil.move(str(stage1), moved_away)
    try:
        again = launch(2, run, dataset, *gate_stage, common=BASE)
        assert "weights from" not in again and "resumed from" in again
    finally:
        shutil.move(str(moved_away), stage1)


def test_a_source_holding_another_model_is_refused_before_training(stage1, dataset, tmp_path):
    run = tmp_path / "gpt2"
    with pytest.raises(AssertionError, match=r"checkpoint.init_from=.* holds another model's weights: .*missing from"):
        launch(1, run, dataset, "train.max_steps=2", f"checkpoint.init_from={stage1}", common=BASE,
               config="configs/experiments/gpt2-small-20k.yaml")
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    with pytest.raises(AssertionError, match=r"checkpoint.init_from=.*nowhere.* does not exist"):
        launch(1, run, dataset, *OURO, f"checkpoint.init_from={tmp_path / 'nowhere'}", common=BASE)
