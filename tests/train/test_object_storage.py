"""Training from object storage (docs/cluster.md, "Object storage"), against a real S3 protocol
server (moto's, tests/helpers/s3.py): rgpt-prep uploads the corpus in 30 small training shards, so a
run fetches them into its cache as it goes. Both runs below must log what the same run on the local
copy of the dataset logs, bitwise: one SIGKILLed and restarted, one whose server is stopped
mid-epoch (the run stops, asks to be requeued, and resumes once the server is back). The
credentials of the test's environment must appear in nothing a run or an export writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.corpus import CORPUS
from tests.helpers.dist import ROOT
from tests.helpers.runs import COMMON, launch, reached, records, train, trajectory
from tests.helpers.s3 import KEY_ID, SECRET, S3Server
from tests.train.test_distributed import _env, kill_and_restart

pytestmark = pytest.mark.slow
BUCKET, URI = "rgpt-test", "s3://rgpt-test/ds"
ARGS = ["train.max_steps=8", "checkpoint.every_steps=3", "eval.every_steps=8", "eval.batches=2", "data.predownload=2",
        "data.download_retry=1", "data.download_timeout_s=5", "parallel.timeout_s=10"]


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def local_copy(s3, tmp_path_factory):
    """rgpt-prep --out s3://rgpt-test/ds with 20 KB shards, its local build kept (the reference's data)."""
    local = tmp_path_factory.mktemp("object-storage") / "built"
    s3.client().create_bucket(Bucket=BUCKET)
    out = subprocess.run([sys.executable, "-m", "data_prep.cli", str(CORPUS), "--out", URI, "--local", str(local),
                          "--seq-len", "32", "--val-fraction", "0.3", "--shard-mb", "0.02"],
                         cwd=ROOT, env={**os.environ, **s3.env()}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return local


@pytest.fixture(scope="module")
def reference(local_copy, tmp_path_factory):
    return train(2, tmp_path_factory.mktemp("object-storage") / "local", local_copy, *ARGS)


def _cache(tmp_path: Path) -> str:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    return f"data.cache_dir={cache}"


def _leaks(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and (SECRET.encode() in (data := p.read_bytes())
                                                                  or KEY_ID.encode() in data)]


def test_prep_lists_the_build_at_the_prefix_and_refuses_to_replace_it(s3, local_copy):
    built = sorted(str(p.relative_to(local_copy)) for p in local_copy.rglob("*") if p.is_file())
    assert s3.keys(BUCKET, "ds/") == [f"ds/{name}" for name in built]
    assert sum(name.endswith(".mds") and name.startswith("train/") for name in built) >= 20
    again = subprocess.run([sys.executable, "-m", "data_prep.cli", str(CORPUS), "--out", URI, "--seq-len", "32"],
                           cwd=ROOT, env={**os.environ, **s3.env()}, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "already holds a dataset" in again.stderr


def test_a_run_from_s3_killed_and_restarted_logs_the_local_run_bitwise_and_leaks_no_credentials(
        s3, local_copy, reference, tmp_path):
    run, cache = tmp_path / "run", _cache(tmp_path)
    args = [f"data.paths=[{URI}]", cache, *ARGS, "log.wandb=offline"]
    env = {**s3.env(), "WANDB_MODE": "offline"}
    cmd = ["configs/experiments/quickstart.yaml", *COMMON, f"log.run_dir={run}", *args]
    resume_at, logged = kill_and_restart(run, 5, cmd, lambda: launch(2, run, URI, *args, env=env), env=env)
    assert 5 <= logged < 8 and resume_at in (3, 6)
    assert trajectory(records(run)) == trajectory(reference)
    assert any((run / "wandb").rglob("*.wandb")), "wandb wrote nothing: the leak check below would not cover it"
    export = tmp_path / "export"
    from launcher.export import main as export_main
    assert export_main([str(run), str(export)]) == 0
    assert not _leaks(run) + _leaks(export) + _leaks(tmp_path / "cache")
    assert URI in (run / "config.yaml").read_text()  # the check above reads what the run wrote


def test_the_server_stopped_mid_epoch_stops_the_run_for_a_requeue_and_it_resumes_bitwise(
        s3, local_copy, reference, tmp_path):
    run, cache = tmp_path / "run", _cache(tmp_path)
    args = [f"data.paths=[{URI}]", cache, *ARGS]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "launcher.train",
           "configs/experiments/quickstart.yaml", *COMMON, f"log.run_dir={run}", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**_env(), **s3.env()}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not reached(run, 4) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        s3.stop()
        stopped = time.time()
        output = proc.communicate(timeout=300)[0]
    finally:
        if s3.proc is None:
            s3.start().put_tree(local_copy, BUCKET, "ds")  # the server back, with the same objects
    took = time.time() - stopped
    marker = json.loads((run / "interrupted.json").read_text())
    assert marker["reason"] == "object storage", marker
    assert f"{URI}/train/" in marker["message"] and s3.url in marker["message"], marker
    assert "could not fetch" in output and s3.url in output, output[-3000:]
    logged = len([r for r in records(run) if "loss" in r])
    assert 4 <= logged < 8, "the run was not interrupted mid-epoch"
    print(f"stopped {took:.1f} s after the server, at step {logged}")
    launch(2, run, URI, *args, env=s3.env())
    assert trajectory(records(run)) == trajectory(reference)
