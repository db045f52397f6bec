"""Hostile datasets: nothing in an index or shard runs code or writes outside the dataset, through
the evaluation reader (rgpt-eval) and the streaming training loader; compressed datasets evaluate."""
import json
import os
import random
import shutil
import signal
import stat
from pathlib import Path

import numpy as np
import pytest

from data_prep.cli import main as prep
from rgpt_dist.data.cache import UnsafeCacheDir, cache_dir, private_dir
from rgpt_dist.data.index import DatasetError, check_split
from rgpt_dist.data.mds import import_streaming
from rgpt_dist.eval.early_exit import val_batches
from tests.helpers.hostile import Payload


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """{"plain", "zstd"}: the same small synthetic corpus prepared without and with compression."""
    root = tmp_path_factory.mktemp("index")
    (root / "in").mkdir()
    for i in range(60):
        words = " ".join(f"w{(i * 7919 + j * 104729) % 10007}" for j in range(30 + i % 11))
        (root / "in" / f"doc{i:03d}.txt").write_text(f"Document {i}: {words}.\n")
    out = {}
    for name, extra in (("plain", []), ("zstd", ["--compression", "zstd"])):
        out[name] = root / name
        assert prep([str(root / "in"), "--out", str(out[name]), "--seq-len", "16", "--val-fraction", "0.3",
                     *extra]) == 0
    return out


def tokens(batches):
    return np.concatenate([np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1) for x, y in batches])


def test_a_compressed_dataset_evaluates_like_the_plain_one_and_stays_untouched(datasets):
    before = sorted(p.name for p in (datasets["zstd"] / "val").rglob("*"))
    plain, zstd = (tokens(val_batches([str(datasets[k])], "val", 4, 5)) for k in ("plain", "zstd"))
    assert plain.shape == (20, 17) and np.array_equal(plain, zstd)
    assert sorted(p.name for p in (datasets["zstd"] / "val").rglob("*")) == before  # decompressed elsewhere


def copy_split(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_index(split_dir: Path, edit) -> None:
    index = json.loads((split_dir / "index.json").read_text())
    edit(index["shards"][0])
    (split_dir / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("name", ["/tmp/escape.mds", "../../escape.mds", "part-00000/../../escape.mds"])
def test_shard_names_outside_the_split_are_refused_before_any_write(datasets, tmp_path, name):
    if name.startswith("/"):
        name = str(tmp_path / "escape.mds")
    ds = copy_split(datasets["zstd"], tmp_path / "a" / "b" / "ds")
    edit_index(ds / "val", lambda s: s["raw_data"].update(basename=name))
    with pytest.raises(DatasetError, match=r"index.json shard 0 raw_data: shard file name .* leaves the split"):
        val_batches([str(ds)], "val", 4, 1)
    assert not list(tmp_path.rglob("escape.mds"))


def test_a_shard_linked_outside_the_split_is_refused(datasets, tmp_path):
    ds = copy_split(datasets["plain"], tmp_path / "ds")
    shard = next((ds / "val").rglob("*.mds"))
    outside = tmp_path / "outside.mds"
    shutil.move(shard, outside)
    shard.symlink_to(outside)
    with pytest.raises(DatasetError, match="resolves outside"):
        check_split(ds / "val")


def write_mds(out: Path, columns: dict, samples: list) -> None:
    streaming = import_streaming()
    with streaming.MDSWriter(out=str(out), columns=columns) as w:
        for s in samples:
            w.write(s)


@pytest.mark.parametrize("encoding", ["pkl", "json"])
def test_pickle_and_json_columns_are_refused_by_every_reader(tmp_path, encoding):
    """A `pkl` sample would run its payload when read; neither rgpt-eval's reader nor the training
    loader reads one (refused from the index, naming it)."""
    from rgpt_dist.data.streaming import token_dataset

    marker = tmp_path / "fired"
    sample = {"tokens": Payload(marker) if encoding == "pkl" else {"a": 1}}
    write_mds(tmp_path / "ds" / "val", {"tokens": encoding}, [sample] * 8)
    with pytest.raises(DatasetError, match=rf"ds/val/index.json shard 0: .*{encoding}.*never pkl or json"):
        val_batches([str(tmp_path / "ds")], "val", 4, 1)
    with pytest.raises(DatasetError, match="never pkl or json"):
        token_dataset([str(tmp_path / "ds")], "val", batch_size=4)
    assert not marker.exists()
    if encoding == "pkl":  # the payload is real: what rgpt-eval used to read with fires it
        import_streaming().LocalDataset(local=str(tmp_path / "ds" / "val"))[0]
        assert marker.exists()


def test_the_streaming_cache_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    made = cache_dir("streaming")
    assert made.is_relative_to(tmp_path) and stat.S_IMODE(made.stat().st_mode) == 0o700
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    with pytest.raises(UnsafeCacheDir, match="mode 777 lets other users in"):
        private_dir(planted)
    (tmp_path / "link").symlink_to(planted)
    with pytest.raises(UnsafeCacheDir, match="found a link"):
        private_dir(tmp_path / "link")
    if os.getuid() == 0:  # root can plant a directory owned by someone else
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        os.chown(other, 12345, 12345)
        with pytest.raises(UnsafeCacheDir, match="owned by uid 12345"):
            private_dir(other)


# ---------------------------------------------------------------------------------------- fuzz
VALUES = [None, -1, 0, 1, 3, 2**33, 1.5, True, "", "..", "../x.mds", "/etc/passwd", "pkl", "json", "zstd",
          "ndarray:uint16:9999999", "ndarray:uint8:17", "x" * 300, [], {}, [None], {"basename": "../y"}]


def mutate(text: str, rng: random.Random) -> str:
    """One random mutation of an index.json text: a value replaced or deleted somewhere in the tree,
    a shard duplicated, or the bytes themselves damaged."""
    kind = rng.randrange(6)
    if kind == 0:
        cut = rng.randrange(len(text))
        return text[:cut] + rng.choice(["", "\x00", "\ud800", "}", "[" * 5000]) + text[cut + rng.randrange(3):]
    obj = json.loads(text)
    nodes = [(None, None, obj)]
    stack = [obj]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
        for key, child in list(items):
            nodes.append((node, key, child))
            stack.append(child)
    parent, key, _ = rng.choice(nodes[1:])
    if kind == 1 and isinstance(parent, dict):
        del parent[key]
    elif kind == 2 and obj.get("shards"):
        obj["shards"].append(json.loads(json.dumps(obj["shards"][0])))
    else:
        parent[key] = rng.choice(VALUES)
    return json.dumps(obj)


def _hang(*_):
    raise TimeoutError("a read hung")


def test_fuzzed_indexes_give_a_clean_refusal_or_a_correct_load(datasets, tmp_path):
    """200 mutations of a valid index (plain and zstd): each read either raises DatasetError/ValueError
    or returns samples of the dataset; never another exception, a hang, or a file written
    outside the reader's private scratch directory."""
    rng = random.Random(1234)
    reference = {k: tokens(val_batches([str(v)], "val", 1, 10**6)) for k, v in datasets.items()}
    outcomes = {"refused": 0, "loaded": 0}
    signal.signal(signal.SIGALRM, _hang)
    for i in range(200):
        kind = "zstd" if i % 2 else "plain"
        ds = copy_split(datasets[kind], tmp_path / f"f{i}")
        index = ds / "val" / "index.json"
        index.write_text(mutate(index.read_text(), rng), errors="surrogatepass")
        before = sorted(str(p) for p in tmp_path.rglob("*"))
        signal.alarm(20)
        try:
            got = tokens(val_batches([str(ds)], "val", 1, 10**6))
            genuine = {row.tobytes() for row in reference[kind]}  # a listed-twice shard reads twice
            assert all(row.tobytes() in genuine for row in got), f"mutation {i}: samples not in the dataset"
            outcomes["loaded"] += 1
        except ValueError as e:  # DatasetError and the empty-split message
            assert str(e), f"mutation {i}: empty message"
            outcomes["refused"] += 1
        finally:
            signal.alarm(0)
        assert sorted(str(p) for p in tmp_path.rglob("*")) == before, f"mutation {i} wrote files"
        shutil.rmtree(ds)
    assert outcomes["refused"] > 100 and outcomes["loaded"] > 5, outcomes
