import pytest
import torch

from rgpt_dist.config import GPT2Config, RecurrentGPTConfig
from rgpt_dist.noise import NoiseKey
from rgpt_dist.parallel.checkpointing import apply_activation_checkpointing
from rgpt_dist.registry import build_model

RGPT = RecurrentGPTConfig(vocab_size=128, block_size=32, d_model=32, n_head=2, n_pre=1, n_rec=2, n_coda=1, n_loops=4,
                          sigma_x=0.3, sigma_g=0.3)


def grads(cfg, mode, r=4, calls=None):
    model = build_model(cfg, seed=0).train()
    units = apply_activation_checkpointing(model, mode)
    if calls is not None:  # count executions of the first core block: r forward, r more if recomputed
        model.recurrence.blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    idx = torch.randint(0, cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    kwargs = {} if isinstance(cfg, GPT2Config) else {"r": r, "noise_key": NoiseKey(seed=3, step=5, micro_batch=1)}
    out = model(idx[:, :-1], idx[:, 1:], **kwargs)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}, units


@pytest.mark.parametrize("mode", ["recurrence", "selective", "blocks"])
def test_checkpointed_gradients_equal_plain_gradients_with_noise_on(mode):
    plain_calls, ckpt_calls = [], []
    loss0, g0, _ = grads(RGPT, "none", calls=plain_calls)
    loss1, g1, units = grads(RGPT, mode, calls=ckpt_calls)
    assert len(units) == (3 if mode == "blocks" else 1)
    assert len(plain_calls) == 4 and len(ckpt_calls) == 8  # the backward really recomputed each step
    assert torch.equal(loss0, loss1)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-6, rtol=0, msg=name)


def test_dense_blocks_are_the_units_and_wrapping_is_idempotent():
    cfg = GPT2Config(vocab_size=64, block_size=16, d_model=32, n_head=2, n_layer=3)
    model = build_model(cfg, seed=0)
    first = apply_activation_checkpointing(model, "recurrence")
    again = apply_activation_checkpointing(model, "recurrence")
    assert len(first) == 3 and again == first
    _, g0, _ = grads(cfg, "none")
    _, g1, _ = grads(cfg, "blocks")
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-6, rtol=0)
