import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rgpt_dist.config import RecurrentGPTConfig
from rgpt_dist.models.recurrent_gpt.model import RecurrentGPT
from rgpt_dist.models.spec import spec_for
from rgpt_dist.noise import NoiseKey
from tests.models import reference

CFG = dict(vocab_size=300, block_size=64, d_model=48, n_head=4, n_pre=1, n_rec=2, n_coda=1, n_loops=3)


def make(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = RecurrentGPTConfig(**{**CFG, **overrides})
    return RecurrentGPT(cfg), cfg


def batch(cfg, B=2, T=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g)
    return idx[:, :-1], idx[:, 1:]


def randomise_(model):
    """Move every parameter off its init: LayerNorm gains and biases become non-trivial, and the gate
    bias drops from +4 to ~N(0, 1) so both branches of the gated update carry weight."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
        model.recurrence.gate_out.bias.normal_(0.0, 1.0)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
@pytest.mark.parametrize("noise", [False, True])
@pytest.mark.parametrize("r", [0, 1, 3, 5])
def test_forward_matches_reference_implementation(noise, r, dtype, tol):
    model, cfg = make(sigma_x=0.3, sigma_g=0.5, tau=0.7)
    randomise_(model)
    model.to(dtype)
    idx, _ = batch(cfg)
    key = NoiseKey(seed=7, step=3, micro_batch=1, dp_rank=0)
    model.train(noise)
    logits = model(idx, r=r, noise_key=key).logits
    draws = None
    if noise:
        shape = (*idx.shape, cfg.d_model)
        draws = [(key.at(i).normal("x", shape, cfg.sigma_x, idx.device, dtype),
                  key.at(i).normal("g", shape, cfg.sigma_g, idx.device, dtype)) for i in range(r)]
    with torch.no_grad():
        expected = reference.recurrent_gpt_logits(model.state_dict(), cfg, idx, r, draws)
    torch.testing.assert_close(logits, expected, atol=tol, rtol=0)
    assert logits.abs().max() > 0.1  # a non-degenerate comparison


def test_noise_changes_output_in_training_only():
    model, cfg = make()
    idx, _ = batch(cfg)
    model.eval()
    a, b = model(idx).logits, model(idx).logits
    assert torch.equal(a, b)
    model.train()
    k1, k2 = NoiseKey(seed=1), NoiseKey(seed=2)
    assert not torch.equal(model(idx, noise_key=k1).logits, model(idx, noise_key=k2).logits)
    assert not torch.equal(model(idx, noise_key=k1).logits, a)


def test_gate_mean_at_init_is_sigmoid_4():
    model, cfg = make(d_model=64, n_loops=4)
    idx, _ = batch(cfg)
    model.eval()
    assert "stats" not in model(idx).aux  # only when asked
    gates = model(idx, stats=True).aux["stats"]["gate_mean"]
    assert gates.shape == (4,)
    assert torch.allclose(gates, torch.full_like(gates, 0.982), atol=0.01)
    assert abs(torch.sigmoid(torch.tensor(4.0)).item() - 0.982) < 1e-3


@pytest.mark.parametrize("r", [1, 2, 3])
def test_every_parameter_gets_a_gradient(r):
    model, cfg = make()
    idx, tgt = batch(cfg)
    model.train()
    model(idx, tgt, r=r, noise_key=NoiseKey(seed=0)).loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_same_seed_and_step_is_bitwise_identical():
    outs = []
    for _ in range(2):
        model, cfg = make(seed=5)
        model.train()
        idx, tgt = batch(cfg)
        out = model(idx, tgt, r=2, noise_key=NoiseKey(seed=1337, step=11, micro_batch=2))
        out.loss.backward()
        outs.append((out.logits, [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(outs[0][0], outs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(outs[0][1], outs[1][1]))


@pytest.mark.parametrize("r_star", [0, 1, 3, 6])
def test_all_exits_equals_forward_at_each_depth(r_star):
    model, cfg = make()
    randomise_(model)
    model.eval()
    idx, tgt = batch(cfg)
    exits = model(idx, tgt, r=r_star, all_exits=True).aux["exit_losses"]
    assert exits.shape == (r_star + 1,)
    for k in range(r_star + 1):
        torch.testing.assert_close(exits[k], model(idx, tgt, r=k).loss, atol=1e-6, rtol=0)


def test_depth_zero_is_prelude_then_coda():
    model, cfg = make()
    model.eval()
    idx, tgt = batch(cfg)
    out = model(idx, tgt, r=0, stats=True)
    assert "stats" not in out.aux
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.flatten(0, 1), tgt.flatten()))


def test_checkpointed_recurrence_redraws_the_same_noise():
    """Recomputation under non-reentrant checkpointing must see the same eps_x/eps_g: gradients equal."""
    grads = []
    for use_ckpt in (False, True):
        model, cfg = make(seed=3, sigma_x=0.5, sigma_g=0.5)
        model.train()
        if use_ckpt:
            step = model.recurrence
            plain_forward = step.forward
            # preserve_rng_state=False: correctness must come from the keys, not from RNG bookkeeping.
            step.forward = lambda *a: checkpoint(plain_forward, *a, use_reentrant=False, preserve_rng_state=False)
        idx, tgt = batch(cfg)
        model(idx, tgt, r=3, noise_key=NoiseKey(seed=9, step=4)).loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_invalid_depth_and_all_exits_without_targets():
    model, cfg = make()
    idx, _ = batch(cfg)
    with pytest.raises(ValueError, match="r=-1"):
        model(idx, r=-1)
    with pytest.raises(ValueError, match="targets"):
        model(idx, all_exits=True)


def test_depth_sampler_comes_from_the_config():
    _, cfg = make(n_loops=6, r_min=2)
    sampler = spec_for(cfg).depth_sampler(cfg)
    assert {sampler(1337, s) for s in range(200)} == set(range(2, 7))


def test_bf16_autocast_runs_and_stays_close_to_fp32():
    """Under torch.autocast(bfloat16) with fp32 parameters the matmuls (o, the gate) come out in bf16
    while the residual stream stays fp32: the gated update must accept both (it once raised in
    torch.lerp), train, and stay within bf16 rounding of the fp32 forward."""
    model, cfg = make()
    randomise_(model)
    x, y = batch(cfg)
    model.train()
    key = NoiseKey(seed=0, step=0)
    ref = model(x, y, r=3, noise_key=key).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x, y, r=3, noise_key=key)
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and abs(out.loss.item() - ref.item()) < 0.05
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
