import pytest

from tests.helpers.runs import DP, train


@pytest.fixture(scope="session")
def reference_run(dataset, tmp_path_factory):
    """(run directory, metrics records) of one process, fp32, noise off: the run every data-parallel
    layout must reproduce (test_distributed.py: records and final weights) and the fp32 run
    bf16-autocast is compared with (test_autocast.py). ZeRO-1, so that the reference's gradient norm
    is DeepSpeed's own (the ZeRO-0 norm and clipping are the trainer's, and are checked against it:
    ZeRO-0's weights came 5.8e-5 apart from it while DeepSpeed's float32 clipping norm did them)."""
    run = tmp_path_factory.mktemp("ref")
    return run, train(1, run, dataset, "parallel.zero_stage=1", *DP, "eval.batches=8", log_samples=True)


@pytest.fixture(scope="session")
def reference(reference_run):
    """The records of `reference_run`."""
    return reference_run[1]


@pytest.fixture(scope="session")
def reference_twin(reference_run):
    """`reference_run` replayed in float64 in a plain torch loop (tests/helpers/replay.py): what
    float32 rounding does to this trajectory on the host at hand, the scale of the bounds the
    data-parallel layouts are held to."""
    import torch

    from tests.helpers.replay import replay
    return replay(reference_run[0], torch.float64)
