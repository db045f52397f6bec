"""A real one-node SLURM cluster on localhost for tests (Debian's slurm-wlm + munge).

`LocalSlurm.start(workdir)` installs the packages when missing (root + apt only), starts munged,
slurmctld and slurmd with a private slurm.conf, and returns a handle whose `env` points the client
commands (sbatch, squeue, scontrol, sacct-free) at it. It raises `SlurmUnavailable` only for the
reasons `unavailable()` names (the packages are missing and cannot be installed: not root, no
apt-get, or no apt source offers them), the one case for pytest.skip, and only where the tests are
not required (`required()`): CI runs as root, so as root (or with CI set, or RGPT_REQUIRE_SLURM=1)
unavailability is a RuntimeError too, unless RGPT_OFFLINE=1 declares a root machine without package
sources. Any other failure (apt-get failing on packages it offers, a daemon that does not start, a
node that never becomes idle) is always a RuntimeError: a broken setup must fail the tests, not skip
them. See ../shared/ENVIRONMENT.md, "SLURM on one machine".
"""
from __future__ import annotations

import os
import random
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kwargs)


class SlurmUnavailable(RuntimeError):
    """SLURM is not installed and cannot be here (the reason is the message)."""


def _installed() -> bool:
    return all(shutil.which(c) for c in ("sbatch", "slurmctld", "slurmd", "munged"))


def _without_candidate() -> list[str]:
    """The packages no configured apt source offers (`apt-cache policy`: no candidate)."""
    missing = []
    for package in PACKAGES:
        out = _run(["apt-cache", "policy", package]).stdout
        if "Candidate:" not in out or "Candidate: (none)" in out:
            missing.append(package)
    return missing


def unavailable() -> str | None:
    """Why a cluster cannot be started here (None when it can be tried): the packages are missing and
    this process cannot install them. apt's lists are refreshed once before deciding that apt has
    no candidate."""
    if _installed():
        return None
    if os.geteuid() != 0:
        return "slurm-wlm is not installed and cannot be: installing it needs root"
    if not shutil.which("apt-get"):
        return "slurm-wlm is not installed and cannot be: no apt-get"
    if _without_candidate():
        _run(["apt-get", "update", "-qq"], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=600)
        missing = _without_candidate()
        if missing:
            return f"slurm-wlm is not installed and no apt source offers {' '.join(missing)}"
    return None


OFFLINE = ("Failed to fetch", "Unable to fetch", "Temporary failure resolving", "Could not resolve")


def install() -> None:
    """Install the packages if needed (after `unavailable()` said it is possible), refreshing apt's
    lists once if the first attempt fails. SlurmUnavailable when apt cannot download them (offline);
    RuntimeError for any other failure."""
    if _installed():
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = _run(["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES], env=env, timeout=900)
    if done.returncode != 0:
        _run(["apt-get", "update", "-qq"], env=env, timeout=600)
        done = _run(["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES], env=env, timeout=900)
    if done.returncode == 0 and _installed():
        return
    if any(marker in done.stderr for marker in OFFLINE):
        raise SlurmUnavailable(f"slurm-wlm is not installed and apt cannot download it: {done.stderr[-500:]}")
    raise RuntimeError(f"apt-get install {' '.join(PACKAGES)} failed ({done.returncode}): {done.stderr[-1000:]}")


def required() -> str | None:
    """Why the SLURM tests must run here (None: they may skip when SLURM cannot be installed): CI or
    RGPT_REQUIRE_SLURM=1 always; root (how CI runs, able to install the packages) unless
    RGPT_OFFLINE=1 says the machine has no package sources."""
    if os.environ.get("RGPT_REQUIRE_SLURM") == "1":
        return "RGPT_REQUIRE_SLURM=1"
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        return f"CI={os.environ['CI']}"
    if os.geteuid() == 0 and os.environ.get("RGPT_OFFLINE") != "1":
        return "running as root (CI's user; RGPT_OFFLINE=1 lets an offline root machine skip)"
    return None


FAKE_GPUS, FAKE_CPUS = 8, 128  # what a GPU node of the real clusters has


def _fake_gpus(workdir: Path) -> str:
    """gres.conf for FAKE_GPUS "GPUs": character devices aliasing /dev/null, so that the job scripts'
    unmodified `--gpus-per-node=8` header is accepted and scheduled (nothing uses them)."""
    for i in range(FAKE_GPUS):
        dev = workdir / f"gpu{i}"
        if not dev.exists():
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return f"AutoDetect=off\nName=gpu File={workdir}/gpu[0-{FAKE_GPUS - 1}]\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(workdir: Path, host: str, nodes: int = 1) -> str:
    """One node that claims a GPU node's CPUs and GPUs (SlurmdParameters=config_overrides: slurmd
    trusts the configuration instead of the hardware), so `sbatch --test-only` judges the real
    headers; the test jobs themselves run NPROC_PER_NODE=2 CPU ranks. With `nodes` > 1, that many
    nodes n1, n2, ... on this host (Debian's slurmd is built with multiple-slurmd: one daemon per
    node, `slurmd -N NAME`, each on its own port with its own spool, pid and log files), all at
    NodeAddr 127.0.0.1."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    d = workdir
    names = node_names(host, nodes)
    per_node = "" if nodes == 1 else ".%n"
    node = f"NodeAddr=127.0.0.1 CPUs={FAKE_CPUS} RealMemory={mem} Gres=gpu:{FAKE_GPUS} State=UNKNOWN"
    lines = [f"NodeName={host} {node}"] if nodes == 1 else [
        f"NodeName={name} NodeHostname={host} Port={_free_port()} {node}" for name in names]
    return "\n".join([
        "ClusterName=rgpt-test", f"SlurmctldHost={host}(127.0.0.1)", "GresTypes=gpu",
        "SlurmdParameters=config_overrides",
        "AuthType=auth/munge", "CryptoType=crypto/munge", "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool{per_node}", f"SlurmctldPidFile={d}/slurmctld.pid",
        f"SlurmdPidFile={d}/slurmd{per_node}.pid", f"SlurmctldLogFile={d}/slurmctld.log",
        f"SlurmdLogFile={d}/slurmd{per_node}.log", f"SlurmctldPort={_free_port()}",
        *([f"SlurmdPort={_free_port()}"] if nodes == 1 else []),
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "MpiDefault=none", "ReturnToService=2", "KillWait=30",
        "JobRequeue=1", "MinJobAge=600", "SchedulerParameters=sched_interval=1", "SlurmctldTimeout=30",
        # job ids (and so the scripts' rendezvous ports, 20000 + id % 20000) unlike another cluster's
        f"FirstJobId={random.randrange(1000, 19000)}",
        *lines,
        f"PartitionName=debug Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
        "",
    ])


def node_names(host: str, nodes: int) -> list[str]:
    """The cluster's node names: this host's short name alone, or n1 .. nN on it."""
    return [host] if nodes == 1 else [f"n{i}" for i in range(1, nodes + 1)]


# Each node's slurmd in a mount namespace of its own with a private /dev/shm, as separate hosts have:
# the job steps it starts inherit the namespace, so shared-memory names (mosaicml-streaming's, DeepSpeed's)
# collide across "nodes" no more than across real hosts.
PRIVATE_SHM = "mount -t tmpfs -o size=2g tmpfs /dev/shm && exec \"$@\""


class LocalSlurm:
    def __init__(self, workdir: Path):
        self.workdir, self.nodes = workdir, []
        self.conf = workdir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    @classmethod
    def start(cls, workdir: Path, nodes: int = 1) -> "LocalSlurm":
        """The cluster, up: one node (this host), or `nodes` nodes on this host, each slurmd in its
        own mount namespace with a private /dev/shm (PRIVATE_SHM; root: unshare --mount)."""
        try:
            why = unavailable()
            if why:
                raise SlurmUnavailable(why)
            install()
        except SlurmUnavailable as e:
            must = required()
            if must:
                raise RuntimeError(f"the SLURM tests are required ({must}) but {e}") from e
            raise
        self = cls(workdir)
        host = socket.gethostname().split(".")[0]
        self.nodes = node_names(host, nodes)
        for sub in ("state", "spool"):
            (workdir / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(_config(workdir, host, nodes))
        (workdir / "gres.conf").write_text(_fake_gpus(workdir))
        self._start_munge()
        done = _run(["slurmctld", "-f", str(self.conf)], env=self.env)
        if done.returncode != 0:
            raise RuntimeError(f"slurmctld failed to start: {done.stderr}")
        if nodes == 1:
            done = _run(["slurmd", "-f", str(self.conf)], env=self.env)
            if done.returncode != 0:
                raise RuntimeError(f"slurmd failed to start: {done.stderr}")
        else:
            self.daemons = [self._start_node(name) for name in self.nodes]
        self._wait_idle()
        return self

    def _start_node(self, name: str) -> subprocess.Popen:
        """`slurmd -D -N name` in the foreground of its own mount namespace (ends with `scontrol shutdown`)."""
        log = open(self.workdir / f"slurmd-{name}.console", "wb")
        return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", PRIVATE_SHM, "sh",
                                 "slurmd", "-D", "-N", name, "-f", str(self.conf)],
                                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _start_munge(self) -> None:
        if _run(["bash", "-c", "munge -n | unmunge"]).returncode == 0:  # already up and working
            return
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        done = _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"])
        if done.returncode != 0:
            raise RuntimeError(f"munged failed to start: {done.stderr}")

    def _wait_idle(self, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            out = _run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env).stdout.split()  # one line per node
            if len(out) == len(self.nodes) and all(s in ("idle", "mixed") for s in out):
                return
            time.sleep(0.3)
        raise RuntimeError(f"the nodes did not become idle: sinfo says {out!r}; see {self.workdir}/slurmctld.log")

    def run(self, *cmd: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        done = _run(list(cmd), env={**self.env, **kwargs.pop("env", {})}, **kwargs)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done

    def wait_requeued(self, job_id: str, timeout: float = 180) -> None:
        """Until the job (`ID` or an array task `ID_N`) is pending again after its first requeue."""
        deadline = time.time() + timeout
        while True:
            out = self.run("scontrol", "-o", "show", "job", job_id).stdout
            if "Restarts=1" in out and "JobState=PENDING" in out:
                return
            if time.time() > deadline:
                raise TimeoutError(f"job {job_id} was not requeued within {timeout} s: {out}")
            time.sleep(0.2)

    def start_requeued(self, job_id: str) -> None:
        """Start a requeued job 2 s from now instead of after SLURM's requeue delay (about 2 min).
        Not at once: slurmd refuses a launch whose credential is not newer, in whole seconds, than the
        requeue's revocation of the old one ("Job credential revoked"; the job then ends FAILED without
        running). The revocation came before the requeue that wait_requeued saw, so 2 s on is a later second."""
        self.run("scontrol", "update", f"jobid={job_id}", "StartTime=now+2")

    def log_of(self, job_id: str) -> str:
        """The daemons' log lines naming a job (why one ended FAILED without a line of its own output)."""
        base = job_id.split("_")[0]
        lines = [f"{log.name}: {line}" for log in sorted(self.workdir.glob("slurm*.log"))
                 for line in log.read_text(errors="replace").splitlines() if base in line and "] debug" not in line]
        return "\n".join(lines[-40:])

    def job_states(self, job_id: str) -> dict[str, str]:
        """Array task or job id -> state, from scontrol (no accounting database here)."""
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False).stdout
        states = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            key = f"{fields.get('ArrayJobId')}_{fields['ArrayTaskId']}" if "ArrayTaskId" in fields else fields.get("JobId")
            states[key] = fields.get("JobState", "?")
        return states

    def wait(self, job_id: str, timeout: float = 900) -> dict[str, str]:
        """Until no task of the job is pending/running; returns the final states."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            states = self.job_states(job_id)
            if states and all(s not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED")
                              for s in states.values()):
                return states
            time.sleep(1)
        raise TimeoutError(f"job {job_id} still active after {timeout} s: {self.job_states(job_id)}")

    def stop(self) -> None:
        """Kill every job still running (a failed test can leave one, even with a stopped rank, that
        would hold its rendezvous port and its CPUs after the daemons are gone), then stop the daemons."""
        _run(["scancel", "--full", "--signal=KILL", "--user=root"], env=self.env)
        deadline = time.time() + 60
        while _run(["squeue", "-h", "-t", "RUNNING,COMPLETING"], env=self.env).stdout.strip() and time.time() < deadline:
            time.sleep(0.5)
        _run(["scontrol", "shutdown"], env=self.env)
        for daemon in getattr(self, "daemons", []):
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


# the slurm/ job scripts' models shrunk to CPU size (environment overrides, the scripts unmodified)
CPU = ["model.d_model=64", "model.n_head=4", "model.block_size=64", "train.seq_len=32", "train.micro_batch_size=2",
       "train.global_batch_size=8", "train.warmup_steps=1", "parallel.dtype=fp32", "log.every_steps=1",
       "log.wandb=disabled"]


def submit(cluster: "LocalSlurm", script, runs: Path, overrides: list[str], *sbatch_args: str, nproc: int = 2) -> str:
    """sbatch from the repository root with the CPU environment (`nproc` ranks per node); returns the job id."""
    runs.mkdir(parents=True, exist_ok=True)  # SLURM does not create the --output directory
    env = {"NPROC_PER_NODE": str(nproc), "RGPT_RUNS": str(runs), "RGPT_OVERRIDES": " ".join(overrides),
           "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(_ROOT),
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(_ROOT / ".venv" / "torch_extensions"))}
    done = cluster.run("sbatch", "--parsable", f"--output={runs}/%x-%A_%a.out", *sbatch_args, str(script),
                       cwd=_ROOT, env=env)
    return done.stdout.strip().split(";")[0]
