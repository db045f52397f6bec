"""A tiny trained-looking RecurrentGPT and validation batches shared by the Appendix E tests, and
`run_analysis`: an analysis's run() with the files it must write checked."""
import json

import pytest
import torch

from rgpt_dist.eval.appendix.common import Context
from tests.eval.appendix.test_diagnostics import batches as two_batches

from rgpt_dist.config import GPT2Config, RecurrentGPTConfig
from rgpt_dist.registry import build_model

R, V, T = 3, 300, 16


def perturbed(cfg, seed: int):
    """A model whose weights are spread (so gates, attention and losses are not at their init values)."""
    m = build_model(cfg, seed=seed).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return m


@pytest.fixture(scope="session")
def model():
    """1+2x3+1, d=64, 4 heads, padded head (300 -> 320 rows), gates spread over (0, 1)."""
    cfg = RecurrentGPTConfig(vocab_size=V, block_size=32, d_model=64, n_head=4, n_pre=1, n_rec=2, n_coda=1,
                             n_loops=R, gate_bias_init=0.0, pad_vocab_multiple=64)
    m = perturbed(cfg, 0)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        m.recurrence.gate_out.weight.normal_(0.0, 0.5, generator=g)
        m.recurrence.gate_out.bias.normal_(0.0, 1.5, generator=g)
    return m


@pytest.fixture(scope="session")
def dense():
    """A 4-layer dense GPT-2 of the same width and vocabulary (E.4's cross-model CKA)."""
    return perturbed(GPT2Config(vocab_size=V, block_size=32, d_model=64, n_head=4, n_layer=4, pad_vocab_multiple=64), 3)


@pytest.fixture(scope="session")
def batches():
    """Two batches of different sizes; the second ignores some targets (-1) (test_diagnostics')."""
    return two_batches()


@pytest.fixture
def run_analysis(model, batches, tmp_path):
    """module -> (Result, its NAME.json as read back): run(ctx) on the fixtures (Context fields in
    `extra`), after checking that it wrote NAME.json, NAME.csv and its plots, all non-empty."""
    def run(module, **extra):
        res = module.run(Context(model=model, batches=batches, out=tmp_path, **extra))
        for suffix in ("json", "csv"):
            assert (tmp_path / f"{module.NAME}.{suffix}").stat().st_size > 0
        assert res.figures and all(p.stat().st_size > 0 for p in res.figures) and res.summary
        return res, json.loads((tmp_path / f"{module.NAME}.json").read_text())
    return run
