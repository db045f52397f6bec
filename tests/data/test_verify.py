"""Shard files whose offsets point past their end, or whose token ids the model has no embedding for,
are refused before training (preflight) and by rgpt-eval's reader, naming the file and the sample,
never an IndexError mid-run (issue 23)."""
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from data_prep.cli import main as prep
from rgpt_dist.config import load_config
from rgpt_dist.data.index import DatasetError
from rgpt_dist.eval.early_exit import val_batches
from rgpt_dist.train.preflight import preflight

SEQ = 32  # the debug config's train.seq_len


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """{"plain", "zstd"}: one small corpus prepared without and with shard compression."""
    root = tmp_path_factory.mktemp("verify")
    (root / "in").mkdir()
    for i in range(60):
        words = " ".join(f"v{(i * 7919 + j * 104729) % 10007}" for j in range(40 + i % 13))
        (root / "in" / f"doc{i:03d}.txt").write_text(f"Document {i}: {words}.\n")
    out = {}
    for name, extra in (("plain", []), ("zstd", ["--compression", "zstd"])):
        out[name] = root / name
        assert prep([str(root / "in"), "--out", str(out[name]), "--seq-len", str(SEQ), "--val-fraction", "0.3",
                     *extra]) == 0
    return out


def config(ds: Path, tmp_path: Path, *overrides: str):
    return load_config("configs/experiments/debug.yaml", [f"data.paths=[{ds}]", f"log.run_dir={tmp_path / 'run'}",
                                                         *overrides])


def shard_of(ds: Path, split: str = "val") -> tuple[Path, dict]:
    """The first shard file of a split (decompressed name) and its index record."""
    info = json.loads((ds / split / "index.json").read_text())["shards"][0]
    return ds / split / info["raw_data"]["basename"], info


def copy_with(src: Path, dst: Path, edit) -> Path:
    """A copy of a plain dataset whose first val shard's bytes `edit` changes in place."""
    shutil.copytree(src, dst)
    path, info = shard_of(dst)
    data = np.fromfile(path, np.uint8)
    edit(data, info)
    data.tofile(path)
    return dst


def offsets(data: np.ndarray, info: dict) -> np.ndarray:
    return data[4:4 * (info["samples"] + 2)].view(np.uint32)


def set_token(data: np.ndarray, info: dict, sample: int, position: int, value: int) -> None:
    start = int(offsets(data, info)[sample]) + 2 * position
    data[start:start + 2] = np.frombuffer(np.uint16(value).tobytes(), np.uint8)


def test_a_clean_dataset_passes_preflight_plain_and_compressed(datasets, tmp_path):
    for ds in datasets.values():
        assert preflight(config(ds, tmp_path), 1) == []


def test_token_ids_beyond_the_vocabulary_are_refused_by_preflight_and_eval(datasets, tmp_path):
    ds = copy_with(datasets["plain"], tmp_path / "ds", lambda d, i: set_token(d, i, 3, 5, 60000))
    shard, _ = shard_of(ds)
    expected = (f"{shard} (shard 0): sample 3 holds token id 60000 (position 5), not below the model's "
                f"vocabulary size 50257")
    assert preflight(config(ds, tmp_path), 1) == [f"data.paths[0]={str(ds)!r}: {expected}"]
    with pytest.raises(DatasetError, match=r"val/index.json shard 0 \(.*\): sample 3 holds token id 60000 "):
        val_batches([str(ds)], "val", 1, 1, vocab_size=50257)  # the bad sample lies beyond the one read


def test_a_smaller_model_vocabulary_than_the_dataset_s_is_refused(datasets, tmp_path):
    """GPT-2 tokens (up to 50256) for a model of 1000 embeddings, compressed shards decompressed in memory."""
    problems = preflight(config(datasets["zstd"], tmp_path, "model.vocab_size=1000"), 1)
    assert [p.split("/")[-3] for p in problems] == ["train", "val"]  # each split, each a message
    for problem in problems:
        assert ".mds.zstd (shard 0, decompressed): sample 0 holds token id" in problem
        assert problem.endswith("not below the model's vocabulary size 1000")


@pytest.mark.parametrize("case", ["past_end", "overlap", "count"])
def test_shard_offsets_past_the_end_are_refused_by_preflight_and_eval(datasets, tmp_path, case):
    def edit(data, info):
        if case == "past_end":
            offsets(data, info)[-2:] += np.uint32(1 << 20)  # the last sample ends 1 MB past the file
        elif case == "overlap":
            offsets(data, info)[2] -= np.uint32(2)
        else:
            data[:4] = np.frombuffer(np.uint32(info["samples"] + 1).tobytes(), np.uint8)
    ds = copy_with(datasets["plain"], tmp_path / "ds", edit)
    shard, info = shard_of(ds)
    n, size = info["samples"], shard.stat().st_size
    last = int(offsets(np.fromfile(shard, np.uint8), info)[-1])
    expected = {"past_end": f"sample {n - 2} ends at byte {last - 2 * (SEQ + 1)}, past the end of the file "
                            f"({size} bytes)",
                "overlap": f"sample 1 spans bytes", "count": f"the file holds {n + 1} samples, the index records {n}"}
    [problem] = preflight(config(ds, tmp_path), 1)
    assert problem.startswith(f"data.paths[0]={str(ds)!r}: {shard} (shard 0): {expected[case]}"), problem
    with pytest.raises(DatasetError, match=r"shard 0 \(.*\): " + re.escape(expected[case])):
        val_batches([str(ds)], "val", 1, 1)
