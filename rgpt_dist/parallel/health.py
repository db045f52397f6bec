"""Which rank stopped answering: a heartbeat per rank in the job's c10d store, read when a collective
fails.

A failed collective names no culprit: gloo says "Connection reset by peer [addr]" when a peer's
process died, or "Timed out waiting 600000ms for recv operation to complete" after
parallel.timeout_s when a peer stalled (a stopped process, a hung device). So every rank runs a
heartbeat thread that bumps a counter in the rendezvous store (the TCPStore torchrun or rank 0 hosts
at MASTER_ADDR:MASTER_PORT) every `interval` seconds, with its node, pid and training step. A stopped
process stops its thread with it; a killed one stops counting. When a collective fails, the
survivors read every counter, wait two intervals and read again: the ranks whose counter did not
move stopped answering. When the store itself no longer answers, the node hosting it (the
rendezvous endpoint's, normally the job's first node) is the one lost. Only then is the failure a lost peer (the job is worth
requeueing from its checkpoint); with every peer still beating it is an error of the run, raised as
it is.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

from torch.distributed import TCPStore

KEY = "rgpt/heartbeat/{attempt}/{rank}"
FAILED = "rgpt/failed/{attempt}/{rank}"  # a rank that raised an error of its own says so before it exits


def node_name() -> str:
    """This process's node: SLURM's name for it where SLURM started us (several "nodes" may share a
    host name, and a cluster's node names are what its operators read), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def interval_for(timeout_s: float) -> float:
    """Heartbeat period for a collective timeout: an eighth of it, between 0.5 and 5 seconds, so the
    diagnosis (two periods) adds at most 10 seconds, well inside the grace SLURM gives a step it
    terminates (KillWait, often 30 s) once srun has seen the lost node's task die."""
    return min(max(timeout_s / 8, 0.5), 5.0)


@dataclass
class Diagnosis:
    """Why the collective failed: the ranks that stopped answering (or the store that did), and
    among them those that stopped on an error of their own (then the job failed, it was not lost)."""
    stalled: list[str]
    failed: list[str]
    error: str
    what: str = "a collective failed"  # what this rank saw
    reason: str = "peer lost"  # RUN_DIR/interrupted.json's reason

    @property
    def lost(self) -> bool:
        """A peer vanished or stalled without an error of its own: worth requeueing."""
        return not self.failed

    def message(self, rank: int, step: int) -> str:
        return (f"{self.what} on rank {rank} ({node_name()}, pid {os.getpid()}) at step {step}: "
                f"{'; '.join(self.failed or self.stalled)} ({self.error})")


class Heartbeat:
    """One rank's heartbeat (a daemon thread); `diagnose` tells a lost peer from an error of the run."""

    def __init__(self, store, rank: int, world: int, interval: float, progress: Callable[[], int]):
        self.store, self.rank, self.world, self.interval, self.progress = store, rank, world, interval, progress
        self.attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # a restarted group beats anew
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rgpt-heartbeat", daemon=True)

    @classmethod
    def start(cls, rank: int, world: int, timeout_s: float, progress: Callable[[], int]) -> "Heartbeat | None":
        """Connects its own client to the rendezvous store (its own short timeout: a store that is
        gone must not hold the diagnosis for parallel.timeout_s) and starts beating; None, said
        once, where no store can be reached (a launcher that sets no MASTER_ADDR / MASTER_PORT): the
        run then trains as before, and a failed collective ends it with the backend's own error."""
        try:
            store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                             timeout=timedelta(seconds=30), wait_for_workers=False)
            beat = cls(store, rank, world, interval_for(timeout_s), progress)
            beat._beat()
        except (KeyError, ValueError, RuntimeError) as e:  # DistError is a RuntimeError
            if rank == 0:
                print(f"note: no heartbeat ({type(e).__name__}: {e}): a lost rank will not be named", flush=True)
            return None
        beat._thread.start()
        return beat

    def _key(self, rank: int) -> str:
        return KEY.format(attempt=self.attempt, rank=rank)

    def _beat(self) -> None:
        self.count += 1
        self.store.set(self._key(self.rank), json.dumps(
            {"count": self.count, "node": node_name(), "pid": os.getpid(), "step": self.progress()}))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
            except Exception:  # the store is gone: the survivors' diagnosis reports it
                return

    def close(self) -> None:
        self._stop.set()

    def _read(self, key: str = KEY) -> dict[int, dict | None]:
        out = {}
        for rank in range(self.world):
            name = key.format(attempt=self.attempt, rank=rank)
            out[rank] = json.loads(self.store.get(name)) if self.store.check([name]) else None
        return out

    def report_failure(self, error: BaseException, requeue: bool = False) -> None:
        """Before this rank exits on an error of its own: tell the peers, whose collectives then fail
        too, that the job failed here rather than lost a node (best effort: the store may be gone).
        With `requeue` the error is the infrastructure's (object storage that does not answer): the
        peers stop as for a lost node, and the job is requeued."""
        try:
            self.store.set(FAILED.format(attempt=self.attempt, rank=self.rank), json.dumps(
                {"node": node_name(), "pid": os.getpid(), "error": _first_line(error), "requeue": requeue}))
        except Exception:
            pass

    def diagnose(self, error: BaseException) -> Diagnosis | None:
        """After a failed collective: the peers that stopped answering, or None when every peer is
        still beating (the failure is the run's own and is raised as it is). Takes two intervals."""
        what = _first_line(error)
        try:
            before = self._read()
            time.sleep(2 * self.interval + 0.1)
            after, failures = self._read(), self._read(FAILED)
        except Exception as e:
            host = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
            return Diagnosis([f"the rendezvous store at {host} does not answer ({type(e).__name__}): the node "
                              "that hosts it (a torchrun agent at the rendezvous endpoint) is lost"], [], what)
        stalled, failed = [], []
        for rank in range(self.world):
            old, new, fail = before[rank], after[rank], failures[rank]
            if fail is not None and fail.get("requeue"):
                stalled.append(f"rank {rank} (node {fail['node']}, pid {fail['pid']}) stopped first: {fail['error']}")
            elif fail is not None:
                failed.append(f"rank {rank} (node {fail['node']}, pid {fail['pid']}) failed first: {fail['error']}")
            elif rank == self.rank:
                continue
            elif new is None:
                stalled.append(f"rank {rank} never beat")
            elif old is not None and new["count"] == old["count"]:
                stalled.append(f"rank {rank} (node {new['node']}, pid {new['pid']}) stopped answering "
                               f"(no heartbeat for {2 * self.interval:.1f} s; its last step {new['step']})")
        return Diagnosis(stalled, failed, what) if stalled or failed else None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"
