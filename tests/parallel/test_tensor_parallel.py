import json

import pytest

from tests.helpers.dist import torchrun


@pytest.mark.slow
def test_tp2_matches_tp1_forward_gradients_and_resharding(tmp_path):
    """Dense GPT-2 and RecurrentGPT (noise on, r = 3), vocabulary padded to 128 x tp with the padding
    masked: tp = 2 logits, loss and every gathered gradient equal tp = 1 with the same weights, and
    split -> merge of the state dict is bitwise the identity."""
    torchrun("tests.parallel.tp_equal", 2, str(tmp_path / "out"))
    for rank in (0, 1):
        results = json.loads((tmp_path / f"out.{rank}.json").read_text())
        for family, got in results.items():
            assert got["loss"] < 1e-5 and got["logits"] < 1e-5 and got["grads"] < 1e-5, (family, rank, got)
            assert got["roundtrip_bitwise"], (family, rank)
