"""E.4 cross-model CKA against linear_cka on the full token matrices, captured by hand: the recurrent
states by stepping model.recurrence directly, the dense layers by running its blocks one by one."""
import pytest
import torch

from rgpt_dist.config import GPT2Config
from rgpt_dist.eval.appendix import dense_cka
from rgpt_dist.eval.appendix.diagnostics import linear_cka
from rgpt_dist.registry import build_model
from tests.eval.appendix.conftest import R, V


@torch.no_grad()
def recurrent_states(model, x, r):
    """h^(0..r), each (B, T, d), from the model's modules without hooks."""
    h = model.embed(x)
    for block in model.prelude:
        h = block(h)
    anchor, states = model.recurrence.anchor(h), [h]
    for i in range(r):
        states.append(model.recurrence(states[-1], anchor, i, None)[0])
    return states


@torch.no_grad()
def dense_states(dense, x):
    """z^(0..L): the embeddings, then each block's output."""
    states = [dense.embed(x)]
    for block in dense.blocks:
        states.append(block(states[-1]))
    return states


def stacked(states_per_batch):
    """k lists of (B, T, d) per batch -> k (n, d) token matrices over all batches."""
    return [torch.cat([s.flatten(0, 1) for s in per_rep]) for per_rep in zip(*states_per_batch)]


def narrow_dense():
    """A 2-layer dense model of another width (CKA compares d = 64 with d = 32)."""
    return build_model(GPT2Config(vocab_size=V, block_size=32, d_model=32, n_head=2, n_layer=2), seed=7).eval()


@pytest.mark.parametrize("which", ["same_width", "narrow"])
def test_cross_cka_matches_linear_cka(model, dense, batches, which):
    other = dense if which == "same_width" else narrow_dense()
    matrix = dense_cka.cross_cka(model, other, batches, R)
    hs = stacked([recurrent_states(model, x, R) for x, _ in batches])
    zs = stacked([dense_states(other, x) for x, _ in batches])
    expected = [[linear_cka(h, z) for z in zs] for h in hs]
    assert len(matrix) == R + 1 and len(matrix[0]) == len(other.blocks) + 1
    assert torch.allclose(torch.tensor(matrix), torch.tensor(expected), atol=1e-9)
    assert 0.0 < min(map(min, matrix)) and max(map(max, matrix)) < 1.0   # not trivially 0 or 1


def test_best_layers():
    assert dense_cka.best_layers([[0.1, 0.7, 0.3], [0.2, 0.1, 0.9]]) == [(1, 0.7), (2, 0.9)]


def test_vocabulary_mismatch_raises(model, batches):
    other = build_model(GPT2Config(vocab_size=V + 1, block_size=32, d_model=32, n_head=2, n_layer=1), seed=0).eval()
    with pytest.raises(ValueError, match=f"{V + 1}.*{V}"):
        dense_cka.cross_cka(model, other, batches, R)


def test_run_writes_outputs(run_analysis, dense):
    res, data = run_analysis(dense_cka, dense=dense)
    assert data["best_layer"] == [max(range(len(row)), key=row.__getitem__) for row in data["cka"]]
    assert len(res.rows) == R + 1
