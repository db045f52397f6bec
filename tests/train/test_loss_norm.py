"""train.loss_norm: the RLT paper's per-example loss normalisation ("example") against a reference
written here from its definition (each example's mean over its scored tokens, then the mean over the
examples that have one), for the plain and the tensor-parallel factory and for Ouro's objective;
"token" (the default) leaves the loss of every run bitwise as it was."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from rgpt_dist.config import GPT2Config
from rgpt_dist.models.layers import LayerFactory
from rgpt_dist.models.ouro.config import OuroConfig
from rgpt_dist.registry import build_model
from tests.helpers.dist import torchrun

VOCAB, PADDED = 11, 16


def factory(norm: str) -> LayerFactory:
    f = LayerFactory()
    f.loss_norm = norm
    return f


def planted_batch(seed=0):
    """(B=4, T=6) fp64 logits over a padded vocabulary and targets scoring 1, 5, 0 and 2 tokens."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 6, PADDED, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, VOCAB, (4, 6), generator=g)
    targets[0, :5] = -1      # one scored token (the parity / mod-5 case)
    targets[1, 0] = -1       # five
    targets[2, :] = -1       # none: all padding, counts for nothing
    targets[3, :4] = -1      # two
    return logits, targets


def reference_example_mean(logits, targets, vocab):
    """Plain loops: -log softmax over the real vocabulary at each scored token, averaged per example,
    then over the examples with at least one scored token."""
    means = []
    for b in range(targets.shape[0]):
        losses = []
        for t in range(targets.shape[1]):
            y = int(targets[b, t])
            if y < 0:
                continue
            row = [float(v) for v in logits[b, t, :vocab]]
            top = max(row)
            losses.append(top + math.log(sum(math.exp(v - top) for v in row)) - row[y])
        if losses:
            means.append(sum(losses) / len(losses))
    return sum(means) / len(means)


def test_example_norm_is_the_per_example_mean():
    logits, targets = planted_batch()
    got = factory("example").cross_entropy(logits, targets, VOCAB)
    want = reference_example_mean(logits, targets, VOCAB)
    assert got.item() == pytest.approx(want, rel=1e-12, abs=0)
    token = factory("token").cross_entropy(logits, targets, VOCAB).item()
    assert abs(token - want) > 0.02, "the planted batch does not tell the two normalisations apart"


def test_token_norm_is_torch_cross_entropy_bitwise():
    """The default reduction is the one before loss_norm existed, to the bit."""
    logits, targets = planted_batch(1)
    got = factory("token").cross_entropy(logits.float(), targets, VOCAB)
    want = F.cross_entropy(logits.float()[..., :VOCAB].flatten(0, 1), targets.flatten(), ignore_index=-1)
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["gpt2", "ouro"])
def test_token_norm_factory_trains_bitwise_like_the_default_model(family):
    """run.py now always passes a factory; with loss_norm=token loss and gradients are unchanged."""
    cfg = tiny(family)
    x, y = batch_of(cfg)
    outs = []
    for f in (None, factory("token")):
        model = build_model(cfg, factory=f, seed=3).train()
        out = model(x, y)
        (out.loss + out.aux.get("aux_loss", 0.0)).backward()
        outs.append((out.loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    assert torch.equal(outs[0][0], outs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(outs[0][1], outs[1][1]))


def tiny(family):
    common = dict(vocab_size=VOCAB, pad_vocab_multiple=1, block_size=16, d_model=32, n_head=2)
    if family == "gpt2":
        return GPT2Config(n_layer=2, **common)
    return OuroConfig(n_pre=1, n_rec=1, n_coda=1, n_loops=3, entropy_beta=0.3, **common)


def batch_of(cfg):
    _, targets = planted_batch(2)
    x = torch.randint(0, cfg.vocab_size, targets.shape, generator=torch.Generator().manual_seed(5))
    return x, targets


@pytest.mark.parametrize("family", ["gpt2", "ouro"])
def test_example_norm_of_a_model_is_the_mean_of_one_example_batches(family):
    """For a model (sequences do not interact), the example-normalised loss of a batch equals the
    mean over its examples with scored tokens of each one's token-mean loss run alone (a batch of one,
    loss_norm=token); for Ouro so does its whole objective J (loss + aux_loss) and its CE_r."""
    cfg = tiny(family)
    x, y = batch_of(cfg)
    model = build_model(cfg, factory=factory("example"), seed=4).double().train()
    out = model(x, y)
    whole = (out.loss.item(), (out.loss + out.aux.get("aux_loss", 0.0)).item())
    model.head.factory.loss_norm = "token"  # the model's modules share one factory (Ouro's exits too)
    if family == "ouro":
        assert model.exits.factory is model.head.factory
    alone = []
    for b in range(y.shape[0]):
        if (y[b] >= 0).any():
            o = model(x[b:b + 1], y[b:b + 1])
            alone.append((o.loss.item(), (o.loss + o.aux.get("aux_loss", 0.0)).item()))
    want = [sum(v) / len(alone) for v in zip(*alone)]
    assert whole == pytest.approx(want, rel=1e-12)


def test_tensor_parallel_example_norm_equals_the_reference(tmp_path):
    """tp = 2 (gloo, megatron's vocabulary-parallel cross-entropy on each rank's logit shard)."""
    torchrun("tests.train.tp_loss_norm", 2, str(tmp_path / "out"))
    logits, targets = planted_batch()
    want = reference_example_mean(logits, targets, VOCAB)
    token = F.cross_entropy(logits[..., :VOCAB].flatten(0, 1), targets.flatten(), ignore_index=-1).item()
    for rank in range(2):
        got = json.loads((tmp_path / f"out.{rank}.json").read_text())
        assert got["example"] == pytest.approx(want, rel=1e-6)   # megatron's CE runs in fp32
        assert got["token"] == pytest.approx(token, rel=1e-6)


def test_unknown_loss_norm_is_refused_by_the_factory():
    logits, targets = planted_batch()
    with pytest.raises(ValueError, match="loss_norm 'mean' must be 'token' or 'example'"):
        factory("mean").cross_entropy(logits, targets, VOCAB)
