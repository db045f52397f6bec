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
    from rgpt_dist.export.consolidate import consolidate

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
