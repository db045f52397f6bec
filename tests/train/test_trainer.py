"""Trainer helpers that need no processes (the training loop itself runs under torchrun in
test_distributed.py)."""
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
