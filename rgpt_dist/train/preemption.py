"""Stopping cleanly when the cluster asks: SIGUSR1 (SLURM's `--signal=USR1@T` warning before the
time limit or a preemption) or SIGTERM.

The handler only sets a flag. After each optimizer step the ranks agree on it with one all-reduce
(signals reach ranks at different moments, but every rank must stop after the same step), the
trainer saves a checkpoint of that step and stops, and under SLURM rank 0 asks for the job to be
requeued (`scontrol requeue`, when the config allows it); the requeued job resumes from the
checkpoint, so no step is lost or repeated.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on a signal after saving; run again to resume


class StopRequested:
    """Installs the signal handlers on construction; `close()` restores the previous ones."""

    def __init__(self, signals: tuple[signal.Signals, ...] = SIGNALS):
        self.received: signal.Signals | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in signals}

    def _handle(self, signum: int, frame) -> None:
        self.received = signal.Signals(signum)

    def agreed(self, device: torch.device) -> bool:
        """Collective: True on every rank when any rank received a signal."""
        flag = torch.tensor([0 if self.received is None else 1], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def close(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def ignore_signals(signals: tuple[signal.Signals, ...] = SIGNALS) -> None:
    """After the stop step is saved: ignore further stop signals until the process exits. torchrun
    SIGTERMs the other ranks as soon as the first exits with EXIT_PREEMPTED; a rank still returning
    would otherwise die of that signal (status -15) instead of exiting with EXIT_PREEMPTED."""
    for s in signals:
        signal.signal(s, signal.SIG_IGN)


def requeue_slurm_job() -> str:
    """Ask SLURM to requeue this job (rank 0 only); returns what happened, for the log."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID")
    job_id = (f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job
              else os.environ.get("SLURM_JOB_ID"))
    if not job_id:
        return "not under SLURM: rerun the same command to resume"
    try:
        done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
        problem = done.stderr.strip() if done.returncode != 0 else None
    except (OSError, subprocess.TimeoutExpired) as e:  # no scontrol inside a container, a hung controller
        problem = str(e)
    if problem is not None:
        print(f"scontrol requeue {job_id} failed: {problem}", file=sys.stderr, flush=True)
        return f"requeue of job {job_id} failed; resubmit to resume"
    return f"requeued SLURM job {job_id}"
