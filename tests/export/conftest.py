import pytest

from tests.helpers.hf import isolated_hf


@pytest.fixture(scope="module")
def hf_env(tmp_path_factory):
    """Offline, with transformers' remote-code copies in a temporary directory."""
    with isolated_hf(tmp_path_factory.mktemp("hf_home")) as home:
        yield home
