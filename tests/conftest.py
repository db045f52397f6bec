import pytest


@pytest.fixture(scope="session")
def encoding():
    """The real GPT-2 encoding; `make test` fetches the vocabulary first (`make vocab`)."""
    from rgpt_dist.data.tokenizer import get_encoding
    return get_encoding()


# What the suite's runs may leave on the machine: DeepSpeed's CPU communication buffers (69 MB each),
# and streaming's shared-memory segments and lock files of a run that was killed (SIGKILL tests).
LEFTOVERS = ("/dev/shm/deepspeed_allreduce_buffer_*", "/dev/shm/[0-9][0-9][0-9][0-9][0-9][0-9]_*",
             "/tmp/[0-9][0-9][0-9][0-9][0-9][0-9]_*_filelock")


@pytest.fixture(autouse=True, scope="session")
def _remove_leftovers():
    """Removes, after the session, those of LEFTOVERS that the session created (not what was there)."""
    import glob
    import os
    before = {path for pattern in LEFTOVERS for path in glob.glob(pattern)}
    yield
    for path in {path for pattern in LEFTOVERS for path in glob.glob(pattern)} - before:
        try:
            os.remove(path)
        except OSError:
            pass


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """The frozen test corpus (the package's source at one commit, tests/helpers/corpus.py) tokenized at
    seq_len 32 (tests.helpers.runs.prepare_dataset), prepared
    once per session for every module that trains on it (a module may still define its own
    `dataset`). Read-only: copy it before changing anything in it."""
    from tests.helpers.runs import prepare_dataset
    return prepare_dataset(tmp_path_factory.mktemp("session-data") / "ds")
