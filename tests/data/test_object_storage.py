"""Remote datasets at the data layer, against moto's S3 server (tests/helpers/s3.py): the preflight
fetches each split's index (a dead endpoint, another seq_len: refused before the run starts), shards
are checked as they arrive in the cache and when a run finds them there, and data.paths never holds
credentials. Training from object storage: tests/train/test_object_storage.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from rgpt_dist.data.index import DatasetError
from tests.helpers.s3 import S3Server

BUCKET = "rgpt-data-test"


@pytest.fixture(scope="module")
def s3(dataset, tmp_path_factory):
    """The session's dataset at s3://rgpt-data-test/ds, and at .../bad with one out-of-vocabulary
    token id in its training shard (the index untouched: only reading the shard can tell)."""
    server = S3Server().start()
    bad = tmp_path_factory.mktemp("bad") / "ds"
    shutil.copytree(dataset, bad)
    shard = next((bad / "train").rglob("*.mds"))
    data = np.memmap(shard, np.uint8, mode="r+")
    start = int(data[4:8].view(np.uint32)[0])  # sample 0's first byte (verify.py: the MDS layout)
    data[start + 2 * 5:start + 2 * 6].view(np.uint16)[0] = 65535  # sample 0, position 5
    data.flush()
    del data
    server.put_tree(dataset, BUCKET, "ds")
    server.put_tree(bad, BUCKET, "bad")
    yield server
    server.stop()


@pytest.fixture
def remote_env(s3, monkeypatch, tmp_path):
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    return cache


def _read_all(uri: str, cache: Path) -> int:
    from rgpt_dist.data.streaming import token_dataset, token_loader
    ds = token_dataset(uri, "train", batch_size=4, cache_dir=str(cache), vocab_size=50257, download_retry=1,
                       download_timeout=5)
    return sum(1 for _ in token_loader(ds, 4))


def test_a_shard_with_a_token_outside_the_vocabulary_is_refused_as_it_arrives(s3, remote_env):
    with pytest.raises(DatasetError, match=r"s3://rgpt-data-test/bad/train/part-00000/shard\.00000\.mds \(cached as .*\): "
                       r"sample 0 holds token id 65535 \(position 5\)"):
        _read_all(f"s3://{BUCKET}/bad", remote_env)
    assert not list(remote_env.rglob("*.mds")), "the refused shard stayed in the cache"


def test_a_cached_shard_damaged_after_its_download_is_fetched_again_before_it_is_read(s3, remote_env, capfd):
    whole = _read_all(f"s3://{BUCKET}/ds", remote_env)
    shard = next(remote_env.rglob("*.mds"))
    good = shard.read_bytes()
    with open(shard, "r+b") as fh:  # the sample count of the offsets table: the layout no longer matches
        fh.write(np.uint32(7).tobytes())
    capfd.readouterr()
    assert _read_all(f"s3://{BUCKET}/ds", remote_env) == whole
    err = capfd.readouterr().err
    assert "the file holds 7 samples, the index records" in err and "removed from the cache, fetching it again" in err
    assert shard.read_bytes() == good  # fetched again, whole


def test_the_preflight_fetches_the_index_and_refuses_a_dead_endpoint_another_seq_len_or_a_stale_cache(
        s3, remote_env, monkeypatch):
    from rgpt_dist.config.run import DataConfig
    from rgpt_dist.train.preflight import _remote_problems
    uri, data = f"s3://{BUCKET}/ds", DataConfig(cache_dir=str(remote_env), download_timeout_s=5)
    assert _remote_problems(uri, ["train", "val"], 32, data) == []
    assert _remote_problems(uri, ["train"], 64, data) == ["train holds samples of seq_len 32, but train.seq_len=64"]
    [missing] = _remote_problems(f"s3://{BUCKET}/nothing-here", ["train"], 32, data)
    assert f"s3://{BUCKET}/nothing-here/train/index.json" in missing
    assert _read_all(uri, remote_env) > 0  # the cache now holds the index and the shards
    assert _remote_problems(uri, ["train"], 32, data) == []
    cached = remote_env / "s3" / BUCKET / "ds" / "train" / "index.json"
    cached.write_text(cached.read_text().replace('"samples": ', '"samples":  '))  # another version's index
    [stale] = _remote_problems(uri, ["train"], 32, data)
    assert stale.startswith(f"{cached.parent}: the cache holds another version of {uri}/train"), stale
    dead = S3Server()  # a free port nobody listens on
    monkeypatch.setenv("S3_ENDPOINT_URL", dead.url)
    [problem] = _remote_problems(uri, ["train"], 32, data)
    assert f"could not fetch {uri}/train/index.json from {dead.url}" in problem


@pytest.mark.parametrize("path, reason", [
    ("s3://AKIAXXXX:secret@bucket/ds", "credentials in config.yaml"),
    ("s3://bucket/ds?X-Amz-Signature=abc", "credentials in config.yaml"),
    ("ftp://bucket/ds", "not one streaming reads"),
    ("s3:///ds", "no bucket"),
    ("s3://bucket/../ds", "cached outside"),
])
def test_a_dataset_uri_that_would_record_credentials_or_escape_the_cache_is_refused(path, reason):
    from rgpt_dist.config.run import DataConfig
    problems = DataConfig(paths=[path]).problems("data")
    assert len(problems) == 1 and problems[0].startswith(f"data.paths[0]={path!r}: ") and reason in problems[0]


def test_an_endpoint_shown_in_a_message_loses_its_password():
    from rgpt_dist.data.uri import shown
    assert shown("http://user:pw@minio:9000") == "http://***@minio:9000"
    assert shown("http://minio:9000") == "http://minio:9000"


@pytest.mark.timeout(180)
def test_a_download_failing_mid_epoch_raises_at_once_and_a_new_epoch_raises_too(tmp_path, monkeypatch):
    """streaming's own behaviour here: the epoch ends early without an error when its download
    thread fails (a short epoch taken for a whole one), and the next epoch's start waits forever
    for that thread. Its own server (stopped here), the corpus in 30 shards of 20 KB."""
    import subprocess
    import sys

    from rgpt_dist.data.streaming import token_dataset, token_loader
    from rgpt_dist.data.uri import RemoteDataError
    from tests.helpers.corpus import CORPUS
    from tests.helpers.dist import ROOT

    server = S3Server().start()
    try:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        server.client().create_bucket(Bucket=BUCKET)
        done = subprocess.run([sys.executable, "-m", "data_prep.cli", str(CORPUS), "--out", f"s3://{BUCKET}/small",
                               "--seq-len", "32", "--shard-mb", "0.02"], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        cache = tmp_path / "cache"
        cache.mkdir(mode=0o700)
        ds = token_dataset(f"s3://{BUCKET}/small", "train", batch_size=4, cache_dir=str(cache), vocab_size=50257,
                           download_retry=1, download_timeout=5, predownload=4)
        batches = iter(token_loader(ds, 4))
        read = [next(batches) for _ in range(3)]
        server.stop()
        with pytest.raises(RemoteDataError, match=rf"could not fetch s3://{BUCKET}/small/train/\S+\.mds from "
                                                  rf"{server.url} \(1 attempts, 5 s each\)"):
            for batch in batches:
                read.append(batch)
        assert len(read) < 2000 // 4, "the epoch was read whole: the server was stopped too late to test anything"
        with pytest.raises(RemoteDataError):
            next(iter(token_loader(ds, 4)))
    finally:
        server.stop()


def test_local_is_refused_with_a_local_out(tmp_path, capsys):
    from data_prep.cli import main as prep
    with pytest.raises(SystemExit) as exit_:
        prep(["python-stdlib", "--out", str(tmp_path / "ds"), "--local", str(tmp_path / "build")])
    assert exit_.value.code == 2 and "--local is where a remote --out is built" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
