"""Trainer helpers that need no processes (the training loop itself runs under torchrun in
test_distributed.py)."""
import re
from pathlib import Path

import pytest
import torch

from rgpt_dist.train.trainer import _mean_step_stats


def test_step_statistics_average_over_the_micro_batches_that_ran_each_step():
    """With a depth per micro-batch (depth_per=micro_batch), step i's statistic is the mean over the
    micro-batches deep enough to run it; a depth-0 micro-batch has none. One depth: the plain mean."""
    out = _mean_step_stats([{"g": torch.tensor([1.0, 2.0, 3.0])}, {"g": torch.tensor([3.0])}, {}])
    assert out["g"].tolist() == [2.0, 2.0, 3.0]
    same = [{"g": torch.tensor([1.0, 2.0]), "h": torch.tensor([0.5, 0.25])}, {"g": torch.tensor([3.0, 5.0]),
                                                                              "h": torch.tensor([1.5, 0.75])}]
    assert {k: v.tolist() for k, v in _mean_step_stats(same).items()} == {"g": [2.0, 3.5], "h": [1.0, 0.5]}
    assert _mean_step_stats([{}, {}]) == {}


def test_accumulation_over_micro_batches_of_different_depths_equals_a_hand_loop(dataset, tmp_path):
    """One step of the real trainer (DeepSpeed ZeRO-2, 4 micro-batches of 2, each at its own depth)
    has the gradient of the mean of the micro-batches' losses at their depths, computed by hand;
    running them all at the first depth would give another."""
    import json

    from tests.helpers.dist import torchrun
    from tests.helpers.runs import COMMON

    out = tmp_path / "out.json"
    torchrun("tests.train.accumulate_depths", 1, str(out), *COMMON, f"data.paths=[{dataset}]",
             f"log.run_dir={tmp_path / 'run'}", "model.depth_per=micro_batch", "model.sigma_x=0", "model.sigma_g=0",
             "train.seed=3", "parallel.zero_stage=2", "parallel.activation_checkpointing=recurrence")
    got = json.loads(out.read_text())
    assert len(got["depths"]) == 4 and len(set(got["depths"])) > 1, got
    assert abs(got["trainer"] - got["hand"]["logged depths"]) < 1e-5 * got["trainer"], got
    assert abs(got["trainer"] - got["hand"]["first depth only"]) > 1e-3 * got["trainer"], got


def test_ranks_that_disagree_on_the_depth_stop_on_every_rank(tmp_path):
    """docs/training.md: every rank must run the same depth (ZeRO-3 and tensor-parallel collectives
    inside the forward would hang otherwise); the trainer checks at every log step and every rank
    raises naming the step and the depths, one depth per step or one per micro-batch."""
    import json

    from tests.helpers.dist import torchrun

    torchrun("tests.train.depth_check", 2, str(tmp_path / "out"))
    for rank in (0, 1):
        got = json.loads((tmp_path / f"out.{rank}.json").read_text())
        assert got["same"] == got["same per micro-batch"] == got["none (dense)"] == "agreed", got
        assert got["differ"] == "ranks disagree on the recurrence depth at step 7: max [4], min [3]", got
        assert got["differ in one micro-batch"] == ("ranks disagree on the recurrence depth at step 7: "
                                                    "max [2, 5], min [2, 4]"), got


def _resuming_trainer(saved_changes: dict):
    """A Trainer of the quickstart config whose newest checkpoint was written by that config changed
    by `saved_changes` (section -> fields); loading its state fails the test."""
    from rgpt_dist.config import load_config
    from tests.helpers.resume import resuming_trainer

    cfg = load_config("configs/experiments/quickstart.yaml", ["parallel.zero_stage=2"])
    saved = cfg.to_dict()
    for section, fields in saved_changes.items():
        saved[section] = {**saved[section], **fields}
    return resuming_trainer(cfg, saved)


@pytest.mark.parametrize("changes,refusal", [
    ({"parallel": {"zero_stage": 3}}, "(ZeRO-3, tp = 1, dp = 1 -> ZeRO-2, tp = 1, dp = 1) that cannot be converted: "
                                      "DeepSpeed converts between ZeRO-1 and ZeRO-2 only"),
    ({"parallel": {"zero_stage": 0}}, "(ZeRO-0, tp = 1, dp = 1 -> ZeRO-2, tp = 1, dp = 1) that cannot be converted: "
                                      "ZeRO-0 keeps no partitioned optimizer state"),
    ({"parallel": {"zero_stage": 3, "tp_size": 2}}, "(ZeRO-3, tp = 2, dp = 1 -> ZeRO-2, tp = 1, dp = 1) that cannot "
                                                    "be converted: DeepSpeed converts between ZeRO-1 and ZeRO-2 only"),
    ({"parallel": {"tp_size": 2}}, None), ({"parallel": {"zero_stage": 1}}, None)])
def test_resume_converts_another_layout_where_deepspeed_can_and_refuses_it_elsewhere(changes, refusal):
    """docs/training.md: another tp size or ZeRO stage goes through DeepSpeed's universal checkpoint
    where it converts (ZeRO-1 <-> 2, any tp: the load is then universal; tests/train/test_layout_change.py
    runs them), and stops before any state is loaded where it does not, naming both layouts and the
    way out; a changed budget (train.max_steps) loads as it always did."""
    from rgpt_dist.train.trainer import DifferentRun

    if refusal is None:
        with pytest.raises(AssertionError, match=re.escape("state was loaded before the configs were compared "
                                                           "(universal=True)")):
            _resuming_trainer(changes).resume()
    else:
        with pytest.raises(DifferentRun, match=re.escape(f"/runs/x/checkpoints/step_00000003 was written at another "
                                                         f"layout {refusal}")):
            _resuming_trainer(changes).resume()
    with pytest.raises(AssertionError, match=re.escape("state was loaded before the configs were compared "
                                                       "(universal=False)")):  # the same layout loads as before
        _resuming_trainer({"train": {"max_steps": 10**6}}).resume()


@pytest.mark.parametrize("overrides,refused", [
    (["parallel.zero_stage=3"], ["parallel.zero_stage=3 (ZeRO-3 gathers parameters inside the checkpointed units"]),
    (["parallel.tp_size=2"], ["parallel.tp_size=2 (megatron's row-parallel all-reduce works in place"]),
    (["parallel.tp_size=2", "parallel.zero_stage=3"], ["parallel.zero_stage=3", "parallel.tp_size=2"]),
    (["parallel.zero_stage=2"], [])])
def test_selective_checkpointing_is_refused_where_it_breaks(overrides, refused, capsys):
    """parallel.activation_checkpointing=selective crashes in the first backward under ZeRO-3 and
    trains on wrong gradients under tp > 1 (rgpt_dist.config.run.ParallelConfig._selective_problems):
    the config's validation refuses both before any process starts, saying why and what to use
    instead; the CLI exits with status 2 and the message. Elsewhere (ZeRO 0-2, tp = 1) it runs."""
    from launcher.train import main
    from rgpt_dist.config import ConfigError, load_config

    args = ["parallel.activation_checkpointing=selective", "model.pad_vocab_multiple=256", *overrides]
    if not refused:
        assert load_config("configs/experiments/quickstart.yaml", args).parallel.activation_checkpointing == "selective"
        return
    with pytest.raises(ConfigError) as e:
        load_config("configs/experiments/quickstart.yaml", args)
    lines = [line for line in str(e.value).splitlines() if "selective cannot run" in line]
    assert len(lines) == len(refused) and all(r in line for r, line in zip(refused, lines)), str(e.value)
    assert all(line.endswith("use parallel.activation_checkpointing=recurrence") for line in lines)
    assert main(["configs/experiments/quickstart.yaml", *args]) == 2
    assert "parallel.activation_checkpointing=selective cannot run under" in capsys.readouterr().err
