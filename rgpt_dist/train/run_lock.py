"""One training process group per run directory.

Two jobs training into the same RUN_DIR (e.g. the dense baseline, which is task 0 of both the
isoFLOPs and the isoParams array of a scale) would overwrite each other's checkpoints and metrics.
Rank 0 holds an exclusive advisory lock on RUN_DIR/.lock for its lifetime; a second run fails at
start with the holder's identity. It is a POSIX record lock (fcntl.lockf): owned by the process, not
inherited by the processes it forks (a forked helper that outlives a killed run does not keep the
directory locked), released when the process dies; it works on local disks, NFS (lockd) and Lustre
mounted with `flock` or `localflock`; where the filesystem refuses locks, a warning says so.
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
import warnings
from pathlib import Path

from rgpt_dist.durable import open_regular

_held: list[int] = []  # file descriptors kept open (and locked) until the process exits


class RunDirBusy(RuntimeError):
    pass


def lock_run_dir(run_dir: str | Path, wait_s: float = 10.0) -> None:
    """Take RUN_DIR/.lock or raise RunDirBusy naming the process that holds it. Waits up to wait_s
    for a holder that is exiting (a run killed just before this one was started)."""
    path = Path(run_dir) / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_regular(path, os.O_RDWR | os.O_CREAT)  # a link or FIFO planted at .lock: UnsafePath

    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except (BlockingIOError, PermissionError):  # EAGAIN / EACCES: held by another process
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirBusy(f"{run_dir} is being trained by {holder}; give this run another log.run_dir") from None
        except OSError as e:  # the filesystem has no locks
            warnings.warn(f"cannot lock {path} ({e}): nothing stops a second run in the same directory", stacklevel=2)
            break
    job = os.environ.get("SLURM_JOB_ID")
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}{f', SLURM job {job}' if job else ''}\n".encode())
    _held.append(fd)
