import pytest

from tests.helpers.runs import DP, train


@pytest.fixture(scope="session")
def reference_run(dataset, tmp_path_factory):
    """(run directory, metrics records) of one process, fp32, noise off: the run every data-parallel
    layout must reproduce (test_distributed.py: records and final weights) and the fp32 run
    bf16-autocast is compared with (test_autocast.py). ZeRO-1, so that the reference's gradient norm
    is DeepSpeed's own (the ZeRO-0 norm is the trainer's, and is checked against it)."""
    run = tmp_path_factory.mktemp("ref")
    return run, train(1, run, dataset, "parallel.zero_stage=1", *DP, "eval.batches=8")


@pytest.fixture(scope="session")
def reference(reference_run):
    """The records of `reference_run`."""
    return reference_run[1]
