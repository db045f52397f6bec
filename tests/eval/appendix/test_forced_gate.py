"""E.1 forced gate (rgpt_dist/eval/appendix/forced_gate.py) against independent computations: the
model's own forwards at each depth, and the gate-0 recurrence (h = o) written out from the state dict
with tests/models/reference.py."""

import pytest
import torch
import torch.nn.functional as F

from rgpt_dist.eval.appendix import forced_gate
from tests.models import reference

from .conftest import R, V


def pooled(model, batches, r):
    """Mean of the model's own loss at depth r over every target != -1 of every batch."""
    with torch.no_grad():
        parts = [(float(model(x, y, r=r).loss), int((y != -1).sum())) for x, y in batches]
    return sum(loss * n for loss, n in parts) / sum(n for _, n in parts)


def gate0_by_hand(model, batches, r):
    """h^(i) = o^(i) = core(W_proj [h^(i-1), h_pre]) for r steps, then coda + head; pooled loss."""
    sd, cfg = model.state_dict(), model.cfg
    w_proj = torch.cat([sd["recurrence.proj_h.weight"], sd["recurrence.proj_pre.weight"]], 1)   # (d, 2d)
    total, count = 0.0, 0
    for x, y in batches:
        h_pre = h = reference.prelude(sd, cfg, x)
        for _ in range(r):
            h = torch.cat([h, h_pre], -1) @ w_proj.T
            for i in range(cfg.n_rec):
                h = reference.block(h, sd, f"recurrence.blocks.{i}.", cfg.n_head, cfg.ln_eps)
        for i in range(cfg.n_coda):
            h = reference.block(h, sd, f"coda.{i}.", cfg.n_head, cfg.ln_eps)
        h = reference.layer_norm(h, sd["head.ln_f.weight"], sd["head.ln_f.bias"], cfg.ln_eps)
        logits = (h @ sd["embed.wte.weight"].T)[..., :V]
        total += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1, reduction="sum"))
        count += int((y != -1).sum())
    return total / count


@pytest.fixture(scope="module")
def result(model, batches):
    return forced_gate.forced_gate_losses(model, batches, R)


def test_extended_depths():
    assert forced_gate.extended_depths(6) == [6, 8, 10, 12]
    assert forced_gate.extended_depths(3) == [3, 4, 5, 6]
    assert forced_gate.extended_depths(1) == [1, 2]


def test_gate_one_is_the_prelude_exit(model, batches, result):
    want = pooled(model, batches, 0)
    assert result["loss_gate1"] == pytest.approx(want, abs=1e-6)
    assert result["loss_prelude"] == pytest.approx(want, abs=1e-6)


def test_gate_zero_writes_every_proposal(model, batches, result):
    with torch.no_grad():
        want = gate0_by_hand(model, batches, R)
    assert result["loss_gate0"] == pytest.approx(want, rel=1e-5)
    assert abs(result["loss_gate0"] - result["loss_gate1"]) > 1e-3     # the two forced gates differ


def test_trained_losses_match_forwards_at_each_depth(model, batches, result):
    assert result["r"] == R and result["depths"] == [3, 4, 5, 6] and len(result["loss"]) == 7
    assert result["n_targets"] == sum(int((y != -1).sum()) for _, y in batches)
    for k in range(7):
        assert result["loss"][k] == pytest.approx(pooled(model, batches, k), abs=1e-6)
    assert abs(result["loss"][R] - result["loss_gate0"]) > 1e-3


def test_hook_removed_also_on_error(model, batches):
    x, y = batches[0]
    with torch.no_grad():
        before = model(x, y).logits.clone()
        with forced_gate.gate_forced(model, 0):
            assert not torch.equal(model(x, y).logits, before)
        with pytest.raises(RuntimeError, match="inside"):
            with forced_gate.gate_forced(model, 1):
                raise RuntimeError("inside")
        assert not model.recurrence.gate_out._forward_hooks
        assert torch.equal(model(x, y).logits, before)
    with pytest.raises(ValueError):
        with forced_gate.gate_forced(model, 0.5):
            pass


def test_run_writes_outputs(run_analysis):
    res, data = run_analysis(forced_gate)
    assert data["loss_gate1"] == pytest.approx(data["loss_prelude"], abs=1e-6)
    assert [row["depth"] for row in res.rows] == [0, R, R, 3, 4, 5, 6]
