"""One training process group per run directory.

Two jobs training into the same RUN_DIR (e.g. the dense baseline, which is task 0 of both the
isoFLOPs and the isoParams array of a scale) would overwrite each other's checkpoints and metrics.
Rank 0 holds an exclusive advisory lock on RUN_DIR/.lock for its lifetime; a second run fails at
start with the holder's identity. (flock: reliable on local disks, NFSv4 and Lustre mounted with
`flock`; on filesystems without it the lock is a no-op, which is reported.)
"""
from __future__ import annotations

import fcntl
import os
import socket
import warnings
from pathlib import Path

_held: list[int] = []  # file descriptors kept open (and locked) until the process exits


class RunDirBusy(RuntimeError):
    pass


def lock_run_dir(run_dir: str | Path) -> None:
    """Take RUN_DIR/.lock or raise RunDirBusy naming the process that holds it."""
    path = Path(run_dir) / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = path.read_text().strip() or "another process"
        os.close(fd)
        raise RunDirBusy(f"{run_dir} is being trained by {holder}; give this run another log.run_dir") from None
    except OSError as e:  # the filesystem has no flock
        warnings.warn(f"cannot lock {path} ({e}): nothing stops a second run in the same directory", stacklevel=2)
    job = os.environ.get("SLURM_JOB_ID")
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}{f', SLURM job {job}' if job else ''}\n".encode())
    _held.append(fd)
