"""rgpt_dist/parallel/health.py in one process, the store an in-memory HashStore (the two-node runs
in tests/slurm/test_two_nodes.py exercise it for real): who is named after a failed collective."""
import pytest
from torch.distributed import HashStore

from rgpt_dist.parallel.health import Heartbeat, interval_for

ERROR = RuntimeError("[gloo] Timed out waiting 600000ms for recv operation to complete\nmore")


def beats(store, rank, step=7):
    beat = Heartbeat(store, rank, 3, interval=0.05, progress=lambda: step)
    beat._beat()
    return beat


def test_a_silent_peer_is_named_with_its_node_and_last_step(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-b")
    store = HashStore()
    me, silent = beats(store, 0), beats(store, 1, step=6)
    alive = beats(store, 2)
    alive._thread.start()  # rank 2 keeps beating, rank 1 beat once and stopped
    try:
        got = me.diagnose(ERROR)
    finally:
        alive.close()
    assert got is not None and got.lost and len(got.stalled) == 1
    assert got.stalled[0].startswith("rank 1 (node gpu-b, pid ") and "its last step 6" in got.stalled[0]
    assert got.error == "RuntimeError: [gloo] Timed out waiting 600000ms for recv operation to complete"
    assert "rank 2" not in got.message(0, 7) and "at step 7" in got.message(0, 7)


def test_every_peer_beating_is_an_error_of_the_run_and_a_peer_that_failed_first_is_not_a_lost_one():
    store = HashStore()
    me, others = beats(store, 0), [beats(store, r) for r in (1, 2)]
    for beat in others:
        beat._thread.start()
    try:
        assert me.diagnose(ERROR) is None  # nobody silent: raised as it is, not requeued
        others[0].report_failure(ValueError("bad sample in shard 3"))
        others[0].close()
        got = me.diagnose(ERROR)
    finally:
        for beat in others:
            beat.close()
    assert got is not None and not got.lost
    [failed] = got.failed
    assert failed.startswith("rank 1 (node ") and failed.endswith(") failed first: ValueError: bad sample in shard 3")


def test_a_store_that_is_gone_names_its_host(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "node01")
    monkeypatch.setenv("MASTER_PORT", "29500")
    me = beats(HashStore(), 0)

    class Gone:
        def check(self, keys):
            raise RuntimeError("Connection reset by peer")
    me.store = Gone()
    got = me.diagnose(ERROR)
    assert got.lost and got.stalled == ["the rendezvous store at node01:29500 does not answer (RuntimeError): the node "
                                        "that hosts it (a torchrun agent at the rendezvous endpoint) is lost"]


@pytest.mark.parametrize("timeout,interval", [(1, 0.5), (10, 1.25), (40, 5.0), (600, 5.0), (1e6, 5.0)])
def test_the_heartbeat_period_is_an_eighth_of_the_timeout_within_bounds(timeout, interval):
    assert interval_for(timeout) == interval
