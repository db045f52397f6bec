import json

import pytest
import torch

from tests.helpers.dist import torchrun


@pytest.mark.skipif(torch.cuda.is_available(), reason="the patches apply only where CUDA is absent")
def test_gather_along_last_dim_patch(tmp_path):
    """Unpatched, megatron's gather allocates on CUDA and fails on CPU-only torch; patched, the
    backward of scattering a replicated input across 2 ranks is each rank's slice gradient, in
    rank order (rank k scales its slice by k + 1). The patch applies once."""
    torchrun("tests.parallel.megatron_cpu_worker", 2, str(tmp_path / "out"))
    expected = torch.cat([torch.full((2, 3, 2), 1.0), torch.full((2, 3, 2), 2.0)], dim=-1)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"out.{rank}.json").read_text())
        assert "CUDA" in got["unpatched"], got["unpatched"]
        assert got["applied"] and not got["applied_again"]
        assert torch.equal(torch.tensor(got["grad"]), expected)
