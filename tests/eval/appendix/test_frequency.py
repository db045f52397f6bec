"""E.10 frequency bands (rgpt_dist/eval/appendix/frequency.py) against per-token losses of separate
reference forwards at each depth (tests/models/reference.py), split with masks written out here."""

import pytest
import torch
import torch.nn.functional as F

from rgpt_dist.eval.appendix import frequency
from tests.models import reference

from .conftest import R, V

# finer bands so that the fixture's ids (0..299) fill three of them; the last stays empty
BANDS = (("low", 0, 99), ("mid", 100, 199), ("high", 200, None), ("none", 1000, 2000))


@pytest.fixture(scope="module")
def by_hand(model, batches):
    """y (N,) all targets of both batches and losses (R + 1, N) float64 (0 where y = -1)."""
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches]).flatten()
    with torch.no_grad():
        logits = [reference.recurrent_gpt_logits(model.state_dict(), model.cfg, x, i)[..., :V].flatten(0, 1)
                  for i in range(R + 1)]
    losses = torch.stack([F.cross_entropy(z, y, ignore_index=-1, reduction="none") for z in logits]).double()
    return y, losses


@pytest.mark.parametrize("bands", [BANDS, frequency.BANDS], ids=["fine", "paper"])
def test_bands_match_masked_means(model, batches, by_hand, bands):
    y, losses = by_hand
    d = frequency.band_stats(model, batches, R, bands)
    assert d["n_targets"] == int((y != -1).sum()) == sum(b["n"] for b in d["bands"])
    for (name, lo, hi), got in zip(bands, d["bands"]):
        upper = hi if hi is not None else V
        mask = (y >= lo) & (y <= upper)                                 # y = -1 is below every lo
        assert got["band"] == name and got["n"] == int(mask.sum())
        if not mask.any():
            assert got["loss"] == [None] * (R + 1) and got["recovery"] is None and got["rel_improvement"][1] is None
            continue
        loss = losses[:, mask].mean(1)                                  # (R + 1,)
        torch.testing.assert_close(torch.tensor(got["loss"], dtype=torch.float64), loss, rtol=1e-5, atol=1e-5)
        rel = (loss[:-1] - loss[1:]) / loss[:-1]
        got_rel = torch.tensor(got["rel_improvement"][1:], dtype=torch.float64)
        torch.testing.assert_close(got_rel, rel, rtol=1e-3, atol=2e-6)
        assert got["recovery"] == pytest.approx(float((loss[0] - loss[R]) / loss[0]), rel=1e-3, abs=2e-6)
        assert got["rel_improvement"][0] is None
    populated = [b["n"] > 0 for b in d["bands"]]
    assert populated == ([True, True, True, False] if bands is BANDS else [True, True, False, False])


def test_run_writes_outputs(run_analysis):
    res, data = run_analysis(frequency)
    assert [b["n"] for b in data["bands"]][2:] == [0, 0] and data["bands"][3]["loss"][0] is None
    assert [row["band"] for row in res.rows] == [b[0] for b in frequency.BANDS]
