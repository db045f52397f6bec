import pytest


@pytest.fixture(scope="session")
def encoding():
    """The real GPT-2 encoding; `make test` fetches the vocabulary first (`make vocab`)."""
    from rgpt_dist.data.tokenizer import get_encoding
    return get_encoding()


@pytest.fixture(autouse=True, scope="session")
def _remove_deepspeed_shm_buffers():
    """DeepSpeed's CPU communication op leaves /dev/shm/deepspeed_allreduce_buffer_* (69 MB each)."""
    import glob
    import os
    before = set(glob.glob("/dev/shm/deepspeed_allreduce_buffer_*"))
    yield
    for path in set(glob.glob("/dev/shm/deepspeed_allreduce_buffer_*")) - before:
        try:
            os.remove(path)
        except OSError:
            pass


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """The project's own source tokenized at seq_len 32 (tests.helpers.runs.prepare_dataset), prepared
    once per session for every module that trains on it (a module may still define its own
    `dataset`). Read-only: copy it before changing anything in it."""
    from tests.helpers.runs import prepare_dataset
    return prepare_dataset(tmp_path_factory.mktemp("session-data") / "ds")
