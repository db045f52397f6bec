import torch

from rgpt_dist.noise import NoiseKey
from rgpt_dist.seeding import derive_seed

SHAPE, CPU = (64, 256), torch.device("cpu")


def test_same_key_same_draw_and_every_key_part_matters():
    key = NoiseKey(seed=1, step=2, micro_batch=3, dp_rank=4).at(5)
    a = key.normal("x", SHAPE, 1.0, CPU, torch.float32)
    assert torch.equal(a, key.normal("x", SHAPE, 1.0, CPU, torch.float32))
    variants = [NoiseKey(9, 2, 3, 4, 5), NoiseKey(1, 9, 3, 4, 5), NoiseKey(1, 2, 9, 4, 5), NoiseKey(1, 2, 3, 9, 5),
                NoiseKey(1, 2, 3, 4, 9)]
    for other in variants:
        assert not torch.equal(a, other.normal("x", SHAPE, 1.0, CPU, torch.float32))
    assert not torch.equal(a, key.normal("g", SHAPE, 1.0, CPU, torch.float32))


def test_draws_are_gaussian_with_the_requested_std_and_dtype_independent():
    z = NoiseKey(seed=0).normal("x", (1000, 100), 0.1, CPU, torch.float32)
    assert abs(z.mean().item()) < 0.002 and abs(z.std().item() - 0.1) < 0.002
    z16 = NoiseKey(seed=0).normal("x", (1000, 100), 0.1, CPU, torch.bfloat16)
    assert z16.dtype == torch.bfloat16 and torch.equal(z16, z.to(torch.bfloat16))


def test_fresh_keys_follow_the_global_rng():
    torch.manual_seed(0)
    a = NoiseKey.fresh()
    torch.manual_seed(0)
    assert NoiseKey.fresh() == a and NoiseKey.fresh() != a


def test_derive_seed_is_stable():
    assert derive_seed(1337, 0, "depth") == derive_seed(1337, 0, "depth")
    assert derive_seed(1, 2) != derive_seed(2, 1) and derive_seed("a") != derive_seed("b")
    assert 0 <= derive_seed(-5, 2**40) < 2**63
