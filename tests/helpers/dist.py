"""Run code on N local processes with torchrun's environment (gloo on CPU), as users launch it.

The suite launches about a hundred short runs, and each one spent most of its time starting up:
torchrun's agent imports torch (about 3 s) before it starts the workers, and every worker then
imports torch, dynamo, DeepSpeed, mosaicml-streaming and megatron-core (about 8 s, 2026-12-02, 2
cores) to train for a few seconds. So the workers are forked from a warm interpreter instead:
multiprocessing's forkserver, a fresh `python` that imports those libraries once per test session
(tests.helpers.warm) and forks one child per rank. Each child gets the environment torchrun gives
a worker (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), its own
stdout and stderr, and runs `python -m module args` through runpy; a failed rank ends its peers,
as torchrun does.

torchrun itself stays tested where its behaviour is the point: the preemption, torn-metrics, SLURM and
two-node tests (a lost node: every process of one torchrun agent killed) start it as a command, and
so does `make compare`. The SIGKILL-and-resume tests kill forked ranks (`start`): what they test is
the resume. RGPT_TESTS_TORCHRUN=1 runs every
launch of the suite under torchrun as before (about 10 s more each), and so does a machine where
torch sees a GPU (a CUDA driver must not be initialised before a fork).
"""
from __future__ import annotations

import multiprocessing
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing import forkserver
from multiprocessing.connection import wait
from pathlib import Path
from unittest import mock

import psutil

ROOT = Path(__file__).resolve().parents[2]
WARM = "tests.helpers.warm"
GRACE_S = 10  # how long the other ranks get to exit on their own after one rank failed


def torchrun(module: str, nproc: int, *args: str, timeout: float = 300, env: dict | None = None) -> str:
    """`torchrun --standalone --nproc_per_node nproc -m module args`; returns the ranks' stdout
    (rank 0's first), raises with every rank's output on failure."""
    full_env = _environment(env)
    if os.environ.get("RGPT_TESTS_TORCHRUN") == "1" or _sees_a_gpu():
        return _under_torchrun(module, nproc, args, timeout, full_env)
    return _forked(module, nproc, args, timeout, full_env)


class Started:
    """A launch that runs until a test kills it (`start`): its ranks, forked as `torchrun()` forks
    them, or, under RGPT_TESTS_TORCHRUN=1 or a GPU, a torchrun agent with its workers."""

    def __init__(self, workers: list, logs: str | None, agent: subprocess.Popen | None = None):
        self.workers, self.logs, self.agent = workers, logs, agent

    def running(self) -> bool:
        return self.agent.poll() is None if self.agent else any(w.is_alive() for w in self.workers)

    def pids(self) -> list[int]:
        """Every process of the launch: the agent and its workers, or the ranks."""
        if self.agent is None:
            return [w.pid for w in self.workers]
        agent = psutil.Process(self.agent.pid)
        return [agent.pid, *(c.pid for c in agent.children(recursive=True))]

    def reap(self) -> None:
        """Wait for every process of the launch to end (after a kill) and drop its output."""
        if self.agent is not None:
            self.agent.wait()
        for w in self.workers:
            w.join()
        if self.logs:
            shutil.rmtree(self.logs, ignore_errors=True)


def start(module: str, nproc: int, *args: str, env: dict | None = None) -> Started:
    """`torchrun(module, nproc, *args)` started and not waited for: a test kills it (a lost node, the
    OOM killer) and reaps it. Forking from the warm interpreter spares the kill tests torchrun's cold
    start (8-10 s each); torchrun's own agent is killed in the two-node tests (tests/slurm)."""
    full_env = _environment(env)
    if os.environ.get("RGPT_TESTS_TORCHRUN") == "1" or _sees_a_gpu():
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", module, *args]
        agent = subprocess.Popen(cmd, cwd=ROOT, env=full_env, start_new_session=True, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        return Started([], None, agent)
    logs = tempfile.mkdtemp(prefix="rgpt-launch-")
    return Started(_fork_ranks(module, nproc, args, full_env, logs), logs)


def _environment(env: dict | None) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
            # DeepSpeed compiles its CPU communication op once; keep it with the environment
            "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".venv" / "torch_extensions")),
            **(env or {})}


def _under_torchrun(module, nproc, args, timeout, env) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", module, *args]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"torchrun {module} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _sees_a_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


def _forked(module, nproc, args, timeout, env) -> str:
    """The launch with workers forked from the warm interpreter; output goes through files (a
    pipe could fill up and block a rank)."""
    with tempfile.TemporaryDirectory(prefix="rgpt-launch-") as logs:
        workers = _fork_ranks(module, nproc, args, env, logs)
        failure = _wait(workers, timeout)
        stdout, stderr = ("".join(_read(Path(logs, f"{rank}.{kind}")) for rank in range(nproc))
                          for kind in ("out", "err"))
    if failure:
        raise AssertionError(f"torchrun {module} failed ({failure}):\n{stdout}\n{stderr}")
    return stdout


def _fork_ranks(module, nproc, args, env, logs) -> list:
    """One started process per rank, forked from the warm interpreter with torchrun's environment;
    each writes its stdout and stderr into `logs`."""
    ctx = _warm_context(env)
    port = _free_port()
    workers = []
    for rank in range(nproc):
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                    "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
                    "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "localhost", "MASTER_PORT": str(port),
                    "TORCHELASTIC_RUN_ID": "tests", "TORCHELASTIC_RESTART_COUNT": "0",
                    "TORCHELASTIC_MAX_RESTARTS": "0"}
        worker = ctx.Process(target=_run_worker, args=(module, list(args), rank_env, logs, rank),
                             name=f"{module}[{rank}]")
        worker.start()
        workers.append(worker)
    return workers


def _wait(workers, timeout) -> str | None:
    """Waits for every worker; returns None if all exited 0, else what went wrong. After the first
    failure the others get GRACE_S to exit; whatever still runs then, or at the timeout, is killed."""
    limit, failed = time.monotonic() + timeout, False
    running = list(workers)
    while running:
        ended = wait([w.sentinel for w in running], timeout=max(limit - time.monotonic(), 0))
        running = [w for w in running if w.sentinel not in ended]
        if not failed and any(w.exitcode for w in workers):
            failed, limit = True, min(limit, time.monotonic() + GRACE_S)
        if running and time.monotonic() >= limit:
            for w in running:
                w.kill()
            break
    for w in workers:
        w.join()
    bad = [f"{w.name} exit code {w.exitcode}" for w in workers if w.exitcode]
    if not failed and bad:  # killed at the deadline
        return f"timed out after {timeout} s; {'; '.join(bad)}"
    return "; ".join(bad) or None


def _read(path: Path) -> str:
    """A rank's output file; a rank that died before opening it (a fork that failed) has none."""
    return path.read_text(errors="replace") if path.exists() else f"[no output: {path.name}]\n"


def _run_worker(module: str, args: list[str], env: dict, logs: str, rank: int) -> None:
    """In the forked child: `python -m module args` with `env` as its whole environment."""
    for fd, kind in ((1, "out"), (2, "err")):
        os.dup2(os.open(Path(logs, f"{rank}.{kind}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


_CONTEXT = None


def _warm_context(env):
    """multiprocessing's forkserver context, its server started once with WARM preloaded. The server
    is started with `env`: what the libraries read when they are imported (OMP_NUM_THREADS by the
    OpenMP runtime) must be the workers' values."""
    global _CONTEXT
    if _CONTEXT is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([WARM])
        read_at_import = ("OMP_NUM_THREADS", "PYTHONPATH", "TORCH_EXTENSIONS_DIR")
        with mock.patch.dict(os.environ, {k: env[k] for k in read_at_import}):
            forkserver.ensure_running()
        _CONTEXT = ctx
    return _CONTEXT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
