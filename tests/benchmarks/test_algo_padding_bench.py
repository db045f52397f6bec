"""benchmarks/algo_padding.py: length buckets averaged as micro-batches give the padded batch's
gradients up to fp32 rounding under the study's per-example loss (parity scores one position per
example, swaps-S5 every operation; a token mean would weight S5's buckets unequally), for each of the
study's models, and every arm is timed."""
import re

import pytest
import torch

from benchmarks.algo_padding import main

EPS = torch.finfo(torch.float32).eps


@pytest.mark.parametrize("task", ["parity", "s5_swaps"])
def test_buckets_reproduce_the_padded_gradients_and_every_arm_is_timed(task, capsys):
    threads = torch.get_num_threads()
    try:  # the benchmark sets the process's threads: give them back to the other tests
        assert main(["--quick", "--task", task]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"(rlt1-2\+2|rlt0-2\+2|transformer-4) ", line)]
    assert len(rows) == 3, out
    # a gradient entry sums at most batch x positions = 16 x 7 terms (--quick: cap 6 + BOS): reordered
    # sums and other matmul blockings move it by a few ulps of the largest entry per term at most
    bound = 2 * EPS * 16 * 7
    for row in rows:
        arms = re.findall(r"(padded|\d buckets) ([0-9.]+) s \(([0-9.]+)x, grad diff ([0-9.e+-]+)\)", row)
        assert [a for a, *_ in arms] == ["padded", "2 buckets", "4 buckets", "8 buckets"], row
        assert all(float(sec) > 0 for _, sec, _, _ in arms)
        assert float(arms[0][3]) == 0.0  # recomputed: one step is deterministic
        assert all(float(diff) <= bound for *_, diff in arms[1:]), (row, bound)
