"""Two nodes through SLURM itself: a local cluster of two slurmd daemons on this host (nodes n1 and
n2, Debian's slurmd runs several per host with `-N`), each in its own mount namespace with a private
/dev/shm as separate hosts have (tests.helpers.slurm). slurm/small_isoflops.sh, unmodified, is
submitted with `--nodes=2` and one rank per node: slurm/common.sh starts one torchrun per node with
srun, and the two agents rendezvous over c10d at the first node's address. The same job on one node
with two ranks must train bitwise the same: losses, gradient norms and the final weights (fp32 on
CPU: the same kernels and the same two-rank reductions, so nothing may differ), at ZeRO-2 and with
tensor parallelism split across the two nodes."""
import subprocess

import pytest
import torch

from tests.helpers.dist import ROOT
from tests.helpers.runs import records, trajectory
from tests.helpers.slurm import CPU, LocalSlurm, SlurmUnavailable, submit

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "slurm" / "small_isoflops.sh"
RUN = "recurrentgpt-small-isoflops-20k"  # array task 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Skipped only where tests.helpers.slurm allows it (SLURM cannot be installed and is not required)."""
    try:
        slurm = LocalSlurm.start(tmp_path_factory.mktemp("slurm2"), nodes=2)
    except SlurmUnavailable as e:
        pytest.skip(f"no local SLURM cluster: {e}")
    yield slurm
    slurm.stop()


def dry_run(cluster, nodelist: str, **env) -> list[str]:
    """The srun command slurm/common.sh composes for `nodelist`, as words."""
    full = {**cluster.env, "RGPT_DRY_RUN": "1", "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "4242",
            "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": "2", **env}
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=full, cwd="/")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1].split()


@pytest.mark.parametrize("nodelist,addr", [("node[01-02]", "node01"), ("gpu-a,gpu-b", "gpu-a"),
                                           ("gpu[7,9-10]", "gpu7"), ("n[1-2]", "127.0.0.1")])
def test_rendezvous_address_from_the_hostlist(cluster, nodelist, addr):
    """MASTER_ADDR is the allocation's first node (a SLURM hostlist expanded by scontrol), at its
    NodeAddr where SLURM knows the node (this cluster's n1 is 127.0.0.1: its name resolves nowhere),
    else by name; the port is 20000 + job id % 20000; two nodes, one torchrun each."""
    words = dry_run(cluster, nodelist)
    assert f"--rdzv_endpoint={addr}:24242" in words and "--rdzv_backend=c10d" in words
    assert "--nodes=2" in words and "--nnodes=2" in words and "--ntasks-per-node=1" in words


LAYOUTS = {"zero2": ["parallel.zero_stage=2"],
           "tp2-across-nodes": ["parallel.zero_stage=2", "parallel.tp_size=2", "model.pad_vocab_multiple=256"]}


@pytest.fixture(scope="module")
def trained(cluster, dataset, tmp_path_factory):
    """Array task 1 of slurm/small_isoflops.sh for every layout on 2 nodes x 1 rank and on 1 node x 2
    ranks, the four jobs submitted together (they overlap their start-ups); {(layout, nodes): run dir}."""
    root = tmp_path_factory.mktemp("two-nodes")
    jobs = {}
    for layout, extra in LAYOUTS.items():
        for nodes, nproc in ((2, 1), (1, 2)):
            overrides = [*CPU, "train.max_steps=6", "checkpoint.every_steps=3", "eval.every_steps=3",
                         "eval.batches=2", "model.sigma_x=0", "model.sigma_g=0", f"data.paths=[{dataset}]", *extra]
            runs = root / f"{layout}-{nodes}x{nproc}"
            jobs[layout, nodes] = (submit(cluster, SCRIPT, runs, overrides, "--array=1", f"--nodes={nodes}",
                                          nproc=nproc), runs, nproc)
    out = {}
    for (layout, nodes), (job, runs, nproc) in jobs.items():
        states = cluster.wait(job, timeout=600)
        log = "\n".join(p.read_text() for p in runs.glob("*.out"))
        assert states == {f"{job}_1": "COMPLETED"}, log[-3000:]
        assert f"on {nodes} node(s) x {nproc} ranks" in log
        out[layout, nodes] = runs / RUN
    return out


def weights(run_dir):
    from rgpt_dist.checkpoints.consolidate import consolidate

    return consolidate(run_dir).state_dict


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_nodes_of_one_rank_train_bitwise_like_one_node_of_two(trained, layout):
    """2 nodes x 1 rank == 1 node x 2 ranks: every logged loss, gradient norm, validation loss and the
    final fp32 weights, bitwise. With tp = 2 the tensor-parallel pair spans the two nodes."""
    two, one = trained[layout, 2], trained[layout, 1]
    got, want = records(two), records(one)
    assert trajectory(got) == trajectory(want)
    steps = [r for r in got if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 7)) and all(r["grad_norm"] > 0 for r in steps)
    a, b = weights(two), weights(one)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- a lost node and a hung rank: each ends the job, which requeues itself and resumes bitwise ------

FAULT = [*CPU, "train.max_steps=16", "checkpoint.every_steps=4", "eval.every_steps=0", "model.sigma_x=0",
         "model.sigma_g=0", "parallel.zero_stage=2", "parallel.timeout_s=10"]


def job_processes(job: str, node: str, ranks_only: bool = False) -> list[int]:
    """The pids the job runs on `node` (its torchrun agent, its ranks and their helpers; with
    ranks_only the rank processes alone: those torchrun started, whose parent is no rank), found by
    the environment SLURM gives a job step's tasks."""
    import os
    from pathlib import Path

    found = {}  # pid -> (has RANK, parent pid)
    for proc in Path("/proc").iterdir():
        try:
            env = dict(kv.split("=", 1) for kv in (proc / "environ").read_text().split("\0") if "=" in kv)
            parent = int(next(line.split()[1] for line in (proc / "status").read_text().splitlines()
                              if line.startswith("PPid:")))
        except (OSError, ValueError, StopIteration):
            continue
        if env.get("SLURM_ARRAY_JOB_ID") == job and env.get("SLURMD_NODENAME") == node and "SLURM_STEP_ID" in env:
            found[int(proc.name)] = ("RANK" in env, parent)
    if ranks_only:
        return [pid for pid, (rank, parent) in found.items() if rank and not found.get(parent, (False,))[0]]
    return [pid for pid in found if pid != os.getpid()]


@pytest.fixture(scope="module")
def uninterrupted(cluster, dataset, tmp_path_factory):
    """The fault tests' run on 2 nodes x 1 rank, untouched: what every resumed run must equal."""
    runs = tmp_path_factory.mktemp("uninterrupted")
    job = submit(cluster, SCRIPT, runs, [*FAULT, f"data.paths=[{dataset}]"], "--array=1", "--nodes=2", nproc=1)
    assert cluster.wait(job, timeout=600) == {f"{job}_1": "COMPLETED"}
    return runs / RUN


def fault_then_resume(cluster, dataset, runs, uninterrupted, fault) -> tuple[str, float]:
    """Submit the fault run, wait for the checkpoint of step 4 and step 6, apply `fault(job)`; the
    survivors' interrupted.json appears, the job requeues itself and its second attempt finishes
    from the newest complete checkpoint. Checks the resumed run equals the uninterrupted one bitwise
    and nothing it wrote is torn; returns (the job's log, seconds from the fault to the marker)."""
    import json
    import time

    from rgpt_dist.train.checkpoint import verify

    job = submit(cluster, SCRIPT, runs, [*FAULT, f"data.paths=[{dataset}]"], "--array=1", "--nodes=2", nproc=1)
    run = runs / RUN
    deadline = time.time() + 300
    while not (run / "metrics.jsonl").exists() or len(records(run)) < 6 or not job_processes(job, "n2", True):
        assert time.time() < deadline, "the run did not reach step 6"
        time.sleep(0.2)
    fault(job)
    start = time.time()
    marker = run / "interrupted.json"
    while not marker.exists():
        assert time.time() < start + 120, "no interrupted.json"
        time.sleep(0.1)
    took = time.time() - start
    lost = json.loads(marker.read_text())
    step_of_fault = lost["step"]

    cluster.wait_requeued(f"{job}_1", timeout=120)
    # nothing the survivors wrote is torn: every checkpoint complete and intact, every metrics line whole
    newest = max(int(p.name[5:]) for p in (run / "checkpoints").glob("step_*"))
    assert all(verify(p) is None for p in (run / "checkpoints").glob("step_*"))
    assert 4 <= newest <= step_of_fault
    cluster.start_requeued(f"{job}_1")
    assert cluster.wait(f"{job}_1", timeout=600) == {f"{job}_1": "COMPLETED"}
    log = "\n".join(p.read_text() for p in runs.glob("*.out"))
    print(f"{runs.name}: {took:.1f} s from the fault to interrupted.json")  # docs/cluster.md's figures
    assert f"resumed from {run / 'checkpoints'}/step_{newest:08d} at step {newest}" in log
    assert trajectory(records(run)) == trajectory(records(uninterrupted))
    a, b = weights(run), weights(uninterrupted)
    assert all(torch.equal(a[k], b[k]) for k in b)
    return log, took, lost


def test_a_lost_node_ends_the_job_which_requeues_and_resumes_bitwise(cluster, dataset, tmp_path, uninterrupted):
    """SIGKILL of every process the job runs on node n2 (its torchrun agent and rank) mid-run: the
    rank on n1 sees its collective fail, finds n2's rank silent (no heartbeat for two periods),
    names it, leaves interrupted.json and exits; the batch shell requeues the job, which resumes from
    the newest complete checkpoint and trains bitwise like the uninterrupted run."""
    import os
    import signal

    def kill_node(job):
        pids = job_processes(job, "n2")
        assert len(pids) >= 2, pids  # the agent and its rank at least
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    log, took, lost = fault_then_resume(cluster, dataset, tmp_path, uninterrupted, kill_node)
    # n2's rank named, or, when n2's torchrun agent hosted the rendezvous store (the agents race to
    # host it, both nodes being 127.0.0.1 here), the store that went with it
    assert ("(node n2, pid" in lost["message"] and "stopped answering" in lost["message"]
            or "the rendezvous store at" in lost["message"] and "is lost" in lost["message"]), lost
    assert "(n1, pid" in lost["message"]  # the survivor that reports it
    assert "the run was interrupted (a node or rank lost" in log and "requeueing job" in log
    assert took < 30, took  # measured: detection at once (the peer's connection resets) + 2 heartbeats


def test_a_hung_rank_times_out_names_its_node_and_the_job_resumes_bitwise(cluster, dataset, tmp_path, uninterrupted):
    """SIGSTOP of the rank on n2: the rank on n1 waits parallel.timeout_s = 10 s in its collective,
    then finds n2's rank silent, names it and exits; the job requeues and resumes bitwise."""
    import os
    import signal

    def stop_rank(job):
        [pid] = job_processes(job, "n2", ranks_only=True)
        os.kill(pid, signal.SIGSTOP)
    log, took, lost = fault_then_resume(cluster, dataset, tmp_path, uninterrupted, stop_rank)
    assert "(node n2, pid" in lost["message"] and "Timed out" in lost["message"]
    assert 10 <= took < 10 + 20, took  # the timeout, then two heartbeats (1.25 s each) and the exit
