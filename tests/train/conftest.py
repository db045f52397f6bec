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
def reference_run_zero0(dataset, tmp_path_factory):
    """`reference_run` at ZeRO-0 (torch's AdamW on the module's own parameters, the trainer's gradient
    norm and clip): the one-process run 2 ranks at ZeRO-0 are compared with. Against the ZeRO-1
    reference, ZeRO-0's other optimizer path (not its data parallelism) moved weights by up to 5.8e-5
    after 5 steps (2026-12-03: Adam's g / sqrt(v) amplifies last-bit differences of small gradients)."""
    run = tmp_path_factory.mktemp("ref0")
    return run, train(1, run, dataset, "parallel.zero_stage=0", *DP, "eval.batches=8")


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
