import pytest

from tests.helpers.runs import DP, train


@pytest.fixture(scope="session")
def reference(dataset, tmp_path_factory):
    """One process, fp32, noise off: the run every data-parallel layout must reproduce
    (test_distributed.py) and the fp32 run bf16-autocast is compared with (test_autocast.py). ZeRO-1,
    not 0: on one rank it is plain AdamW too, and it logs the gradient norm (ZERO0_NO_GRAD_NORM)."""
    return train(1, tmp_path_factory.mktemp("ref"), dataset, "parallel.zero_stage=1", *DP, "eval.batches=8")
