import math

import pytest
import torch

from rgpt_dist.config import RecurrentGPTConfig, TrainConfig
from rgpt_dist.models.recurrent_gpt.model import RecurrentGPT
from rgpt_dist.train.optim import (apply_config, clip_gradients, global_grad_norm, lr_at, make_optimizer,
                                  make_scheduler, param_groups)


def test_weight_decay_only_on_matrices():
    model = RecurrentGPT(RecurrentGPTConfig(vocab_size=64, block_size=16, d_model=32, n_head=2))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    names = {id(p): n for n, p in model.named_parameters()}
    assert any("gate_out.bias" in names[id(p)] for p in no_decay["params"])
    assert any("ln_h.weight" in names[id(p)] for p in no_decay["params"])


def test_warmup_then_cosine_to_min_lr():
    cfg = TrainConfig(lr=6e-4, min_lr=6e-5, warmup_steps=2000, max_steps=20000)
    assert lr_at(0, cfg) == pytest.approx(6e-4 / 2001)
    assert lr_at(1999, cfg) == pytest.approx(6e-4 * 2000 / 2001)
    assert lr_at(2000, cfg) == pytest.approx(6e-4)
    assert lr_at(11000, cfg) == pytest.approx((6e-4 + 6e-5) / 2)
    assert lr_at(20000, cfg) == pytest.approx(6e-5) and lr_at(25000, cfg) == pytest.approx(6e-5)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(2000, 20000, 97))


def test_scheduler_drives_the_optimizer():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=3, max_steps=10, beta1=0.9, beta2=0.95)
    model = torch.nn.Linear(4, 4)
    opt = make_optimizer(model, cfg)
    sched = make_scheduler(opt, cfg)
    seen = []
    for _ in range(10):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([lr_at(s, cfg) for s in range(10)])
    assert opt.param_groups[0]["betas"] == (0.9, 0.95) and math.isclose(opt.param_groups[0]["weight_decay"], 0.1)


def test_a_resumed_optimizer_takes_the_new_config_s_hyperparameters():
    """torch's load_state_dict restores the saved lr, betas, eps, decay and LambdaLR's base_lrs: a run
    resumed with another peak lr would keep the old one (the lambda alone follows the new schedule).
    apply_config puts the new config's values back, the no-decay group at 0, muP's scaled group at
    lr / m; the next step's lr is the new schedule's."""
    old = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, max_steps=20, beta1=0.9, beta2=0.95, weight_decay=0.1)
    new = TrainConfig(lr=2e-4, min_lr=1e-5, warmup_steps=2, max_steps=40, beta1=0.8, beta2=0.99, weight_decay=0.0,
                      adam_eps=1e-5)
    model = RecurrentGPT(RecurrentGPTConfig(vocab_size=64, block_size=16, d_model=32, n_head=2, mup_base_width=16))

    def step(opt, sched):
        model(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)), r=1).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()

    opt, sched = make_optimizer(model, old), None
    sched = make_scheduler(opt, old)
    for _ in range(5):
        step(opt, sched)
    saved = opt.state_dict(), sched.state_dict()
    opt2 = make_optimizer(model, new)
    sched2 = make_scheduler(opt2, new)
    opt2.load_state_dict(saved[0])
    sched2.load_state_dict(saved[1])
    assert opt2.param_groups[0]["lr"] == pytest.approx(lr_at(5, old))          # what torch alone leaves
    apply_config(opt2, sched2, new)
    scales = [g.get("lr_scale", 1.0) for g in opt2.param_groups]
    assert scales == [1.0, 1.0, 0.5]
    for i, (g, m) in enumerate(zip(opt2.param_groups, scales)):
        assert g["lr"] == pytest.approx(lr_at(5, new) * m) and g["betas"] == (0.8, 0.99) and g["eps"] == 1e-5
        assert g["weight_decay"] == 0.0
    step(opt2, sched2)
    assert [g["lr"] for g in opt2.param_groups] == pytest.approx([lr_at(6, new) * m for m in scales])
    apply_config(opt2, sched2, old)
    assert [g["weight_decay"] for g in opt2.param_groups] == [0.1, 0.0, 0.1]


def test_a_nan_gradient_on_one_rank_skips_the_update_on_every_rank(tmp_path):
    import json
    from tests.helpers.dist import torchrun
    torchrun("tests.train.skip_step", 2, str(tmp_path / "out"))
    for rank in (0, 1):
        got = json.loads((tmp_path / f"out.{rank}.json").read_text())
        assert got == {"skipped": True, "unchanged": True, "state_empty": True, "second_step_applied": True,
                       "total": 1}, rank


def test_clipping_at_zero0_scales_by_the_float64_norm():
    """ZeRO-0 (parallel.zero.trainer_clips): the norm accumulated in float64 over a large tensor, and
    gradients scaled by max_norm / (norm + 1e-6) only where that is below 1; a non-finite norm leaves
    them alone (the step is skipped). Reference: the 2-norm of the float64 values; the scaled gradient
    within one float32 rounding of each element (the scale is one multiplication)."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (10_000_000, 3)]
    params[0].grad, params[1].grad = torch.randn(10_000_000) * 1e-3, torch.tensor([3.0, -4.0, 12.0])
    exact = math.sqrt(sum((p.grad.double() ** 2).sum().item() for p in params))
    norm = global_grad_norm(params)
    assert norm == pytest.approx(exact, rel=1e-12)
    before = [p.grad.clone() for p in params]
    clip_gradients(params, norm, 1.0)
    for p, g in zip(params, before):
        expected = g.double() * (1.0 / (exact + 1e-6))
        assert torch.allclose(p.grad.double(), expected, rtol=2 * 2**-24, atol=0)
    assert global_grad_norm(params) == pytest.approx(1.0, rel=1e-6)
    kept = [p.grad.clone() for p in params]
    clip_gradients(params, global_grad_norm(params), 2.0)  # below the bound: untouched
    clip_gradients(params, float("nan"), 1.0)
    assert all(torch.equal(p.grad, g) for p, g in zip(params, kept))
