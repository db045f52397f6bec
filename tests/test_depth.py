import collections

import pytest

from rgpt_dist.depth import FixedDepth, UniformDepth, make_sampler


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
