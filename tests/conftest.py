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
