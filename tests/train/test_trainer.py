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
