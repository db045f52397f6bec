"""rgpt_dist.train.metrics.step_flops: a step's tokens and FLOPs over its padded widths and the depths
its micro-batches ran, against the per-token counts (rgpt_dist.flops) summed here part by part."""
import pytest

from rgpt_dist.config import load_config
from rgpt_dist.flops import recompute_flops, train_flops
from rgpt_dist.train.metrics import step_flops

# RecurrentGPT, whose FLOPs per token depend on the depth r and (attention) on the width S
CFG = load_config("configs/experiments/gpt2-small-20k.yaml",
                  ["model=recurrentgpt-debug", "train.seq_len=64", "train.micro_batch_size=2",
                   "train.global_batch_size=8", "parallel.activation_checkpointing=recurrence"])


def _part(S: int, r: int, rows: int) -> tuple[float, float]:
    model = train_flops(CFG.model, S, r) * rows * S
    return model, model + recompute_flops(CFG.model, S, r, "recurrence") * rows * S


def test_one_width_one_depth_is_the_whole_batch_at_seq_len():
    model, hardware, tokens = step_flops(CFG, [64], [3])
    assert tokens == 8 * 64 and (model, hardware) == pytest.approx(_part(64, 3, 8), rel=1e-12)
    assert hardware > model  # the recomputed forward counts in hardware FLOPs only


def test_length_buckets_pair_each_part_with_its_micro_batch_s_depth():
    """Four parts (micro-batches of 2) with a depth each: part j ran at depths[j]; with dp = 2 and
    two micro-batches (depths per micro-batch) parts 2m and 2m + 1 ran at depths[m]."""
    widths, depths = [9, 17, 25, 41], [1, 2, 3, 4]
    model, hardware, tokens = step_flops(CFG, widths, depths)
    parts = [_part(S, r, 2) for S, r in zip(widths, depths)]
    assert tokens == 2 * sum(widths)
    assert (model, hardware) == pytest.approx((sum(p[0] for p in parts), sum(p[1] for p in parts)), rel=1e-12)
    dp2 = step_flops(CFG, widths, [1, 4])
    parts = [_part(S, r, 2) for S, r in zip(widths, [1, 1, 4, 4])]
    assert dp2[:2] == pytest.approx((sum(p[0] for p in parts), sum(p[1] for p in parts)), rel=1e-12)


def test_one_width_and_a_depth_per_micro_batch_average_the_depths():
    model, _, _ = step_flops(CFG, [64], [2, 4])
    assert model == pytest.approx((_part(64, 2, 8)[0] + _part(64, 4, 8)[0]) / 2, rel=1e-12)
