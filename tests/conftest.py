import pytest


@pytest.fixture(scope="session")
def encoding():
    """The real GPT-2 encoding; `make test` fetches the vocabulary first (`make vocab`)."""
    from rgpt_dist.data.tokenizer import get_encoding
    return get_encoding()
