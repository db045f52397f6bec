import pytest


@pytest.fixture(autouse=True, scope="module")
def _clean_streaming_leftovers():
    """Streaming datasets created in this process leave shared memory and lock files: remove them."""
    yield
    from rgpt_dist.data.streaming import cleanup_stale_state
    cleanup_stale_state()
