"""Relaxed Recursive Transformer against an independent re-implementation of its equations (#11)."""
from __future__ import annotations

import pytest
import torch

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.flops import param_count
from rgpt_dist.models.relaxed.config import RelaxedConfig
from rgpt_dist.models.relaxed.model import RelaxedRecursiveGPT
from rgpt_dist.models.spec import spec_for
from tests.models import reference

CFG = dict(vocab_size=300, block_size=64, d_model=48, n_head=4, n_pre=1, n_rec=2, n_coda=1, n_loops=3, lora_rank=4,
           lora_alpha=6.0)


def make(seed=0, randomise=True, **overrides):
    torch.manual_seed(seed)
    cfg = RelaxedConfig(**{**CFG, **overrides})
    model = RelaxedRecursiveGPT(cfg).double()
    if randomise:  # B off zero, so every adapter changes its step
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    return model, cfg


def batch(cfg, B=2, T=20, seed=1):
    idx = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(seed))
    return idx[:, :-1], idx[:, 1:]


@pytest.mark.parametrize("r", [0, 1, 2, 3])
def test_forward_matches_reference(r):
    model, cfg = make()
    idx, _ = batch(cfg)
    ref = reference.relaxed_logits(model.state_dict(), cfg, idx, r)
    assert (model(idx, r=r).logits - ref).abs().max() < 1e-10


def test_adapters_differ_per_step_and_start_as_the_shared_block():
    model, cfg = make(randomise=False)
    assert all((lora.B.weight == 0).all() for step in model.recurrence.adapters for block in step
               for lora in block.values())
    idx, _ = batch(cfg)
    strict = reference.relaxed_logits({k: v * 0 if ".B." in k else v for k, v in model.state_dict().items()},
                                      cfg, idx, 3)
    assert (model(idx).logits - strict).abs().max() < 1e-10  # B = 0: every step is the shared block
    model, _ = make()
    a = model.recurrence.adapters
    assert not torch.equal(a[0][0]["qkv"].B.weight, a[1][0]["qkv"].B.weight)


def test_depth_is_fixed_and_bounded_by_the_adapters():
    model, cfg = make()
    assert spec_for(cfg).depth_sampler(cfg)(1337, 5) == cfg.n_loops
    assert spec_for(cfg).max_eval_depth(cfg) == cfg.n_loops
    idx, tgt = batch(cfg)
    exits = model.eval()(idx, tgt, all_exits=True).aux["exit_losses"]
    assert exits.shape == (cfg.n_loops + 1,)
    with pytest.raises(ValueError, match="adapters for R = 3 steps: depth r=4 does not exist"):
        model(idx, r=4)


def test_lora_is_counted_apart():
    cfg = load_config("rrt-small-isoflops").model
    lora = spec_for(cfg).param_breakdown(cfg)["lora"]
    assert lora == cfg.n_loops * cfg.n_rec * cfg.lora_rank * 16 * cfg.d_model
    with torch.device("meta"):
        model = RelaxedRecursiveGPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg)
    assert sum(p.numel() for n, p in model.named_parameters() if ".adapters." in n) == lora
    with pytest.raises(ConfigError, match="lora_rank=0 must be > 0"):
        load_config("rrt-debug", ["model.lora_rank=0"])
