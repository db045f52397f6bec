import collections

import pytest

from rgpt_dist.depth import FixedDepth, UniformDepth, make_sampler, step_depths


def test_uniform_depth_is_a_pure_function_of_seed_and_step():
    s = UniformDepth(1, 10)
    first = [s(1337, step) for step in range(500)]
    assert first == [UniformDepth(1, 10)(1337, step) for step in range(500)]
    assert first != [s(42, step) for step in range(500)]


def test_uniform_depth_covers_its_range_evenly():
    s = UniformDepth(2, 6)
    counts = collections.Counter(s(0, step) for step in range(20000))
    assert set(counts) == {2, 3, 4, 5, 6}
    assert all(abs(c / 20000 - 0.2) < 0.015 for c in counts.values())
    assert s.mean() == 4 and sum(s.pmf().values()) == pytest.approx(1)


def test_fixed_and_factory():
    assert FixedDepth(4)(1, 2) == 4 and FixedDepth(4).mean() == 4
    assert make_sampler("fixed", 1, 7) == FixedDepth(7)
    with pytest.raises(ValueError, match="r_min=3, r_max=2"):
        UniformDepth(3, 2)
    with pytest.raises(ValueError, match="unknown depth sampler"):
        make_sampler("poisson", 1, 2)


def test_per_micro_batch_depths_are_keyed_by_the_micro_batch():
    """depth_per=micro_batch: a pure function of (seed, step, micro-batch), the same on every rank;
    the per-step draw is unchanged by the option."""
    per_step, per_micro = UniformDepth(1, 8), UniformDepth(1, 8, per_micro_batch=True)
    assert per_micro(5, 3) == per_step(5, 3)
    drawn = [step_depths(per_micro, 5, step, 4) for step in range(50)]
    assert drawn == [step_depths(UniformDepth(1, 8, True), 5, step, 4) for step in range(50)]
    assert sum(len(set(d)) > 1 for d in drawn) > 40 and drawn != [step_depths(per_micro, 6, s, 4) for s in range(50)]
    assert step_depths(per_step, 5, 3, 4) == [per_step(5, 3)] * 4
    assert step_depths(FixedDepth(3), 5, 3, 2) == [3, 3] and step_depths(None, 5, 3, 2) == [None, None]
    assert make_sampler("uniform", 1, 4, per_micro_batch=True).per_micro_batch
