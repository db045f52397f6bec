"""The suite's launcher (tests.helpers.dist): ranks forked from the warm interpreter see what
torchrun gives its workers, and a failed or hung launch ends with every rank's output."""
import json
import time

import pytest

from tests.helpers import dist
from tests.helpers.dist import ROOT, torchrun


def probes(out, nproc):
    return [json.loads(out.with_name(f"{out.name}.{rank}.json").read_text()) for rank in range(nproc)]


def test_forked_ranks_get_torchruns_environment(tmp_path, monkeypatch):
    """Rank, world and OpenMP settings as under torchrun (run once each way), a working gloo group."""
    stdout = torchrun("tests.helpers.probe", 3, str(tmp_path / "forked"), "ok")
    assert all(f"rank {r} wrote its probe" in stdout for r in range(3))
    monkeypatch.setenv("RGPT_TESTS_TORCHRUN", "1")
    torchrun("tests.helpers.probe", 3, str(tmp_path / "torchrun"), "ok")
    forked, reference = probes(tmp_path / "forked", 3), probes(tmp_path / "torchrun", 3)
    assert [p["sum"] for p in forked] == [0 + 1 + 2] * 3
    assert forked == reference  # env keys, the sum, 1 intra-op thread, cwd = the checkout
    assert forked[0]["threads"] == 1 and forked[0]["cwd"] == str(ROOT)


def test_a_failed_rank_ends_its_peers_and_reports_every_rank(tmp_path, monkeypatch):
    """Rank 1 raises, rank 0 waits in a barrier: the launch fails within the grace period, with
    rank 1's traceback and both ranks' stdout."""
    monkeypatch.setattr(dist, "GRACE_S", 2)
    start = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        torchrun("tests.helpers.probe", 2, str(tmp_path / "p"), "fail", timeout=120)
    assert time.monotonic() - start < 60
    message = str(failed.value)
    assert "rank 1 fails on purpose" in message and "exit code 1" in message
    assert "rank 0 wrote its probe" in message and "rank 1 wrote its probe" in message


def test_a_hung_launch_is_killed_at_its_timeout(tmp_path):
    start = time.monotonic()
    with pytest.raises(AssertionError, match="timed out after 3 s"):
        torchrun("tests.helpers.probe", 2, str(tmp_path / "p"), "hang", timeout=3)
    assert time.monotonic() - start < 30
