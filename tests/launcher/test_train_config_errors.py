"""Bad configs fail before any process group, model or loader exists, naming field and value."""
import time

import pytest

from launcher.train import main

BASE = ["model=recurrentgpt-debug", "train.seq_len=32", "train.micro_batch_size=2", "train.global_batch_size=8",
        "train.warmup_steps=1", "train.max_steps=4"]


@pytest.fixture
def data_dir(tmp_path):
    from data_prep.cli import main as prep
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("some words " * 4000)
    assert prep([str(tmp_path / "in"), "--out", str(tmp_path / "ds"), "--seq-len", "32", "--val-fraction", "0"]) == 0
    return tmp_path / "ds"


CASES = [
    (["train.global_batch_size=7"], "train.global_batch_size=7 is not a multiple of train.micro_batch_size=2"),
    (["train.global_batch_size=6"], "train.global_batch_size=6 is not divisible by train.micro_batch_size=2 x 4 data-parallel ranks"),
    (["parallel.zero_stage=4"], "parallel.zero_stage=4 must be 0, 1, 2 or 3"),
    (["parallel.dtype=fp16"], "parallel.dtype='fp16' is not one of ['fp32', 'bf16', 'bf16-autocast']"),
    (["parallel.activation_checkpointing=all"], "parallel.activation_checkpointing='all' is not one of"),
    (["data.paths=[/no/such/dir]"], "data.paths[0]='/no/such/dir': no train/index.json"),
    (["data.paths=[]"], "data.paths is empty"),
    (["train.seq_len=64"], "holds samples of seq_len 32, but train.seq_len=64"),
    (["train.sedd=1"], "train.sedd is not a field of TrainConfig"),
    (["checkpoint.every_steps=0"], "checkpoint.every_steps=0 must be >= 1"),
    (["eval.batches=0"], "eval.batches=0 must be >= 1"),
    (["log.every_steps=0"], "log.every_steps=0 must be >= 1"),
    (["model.n_loops=0"], "model.n_loops=0 must be >= 1"),
    (["train.max_steps=0"], "train.max_steps=0 must be > 0"),
]


@pytest.mark.parametrize("overrides,message", CASES, ids=[m[:40] for _, m in CASES])
def test_bad_config_exits_2_fast_with_a_message(overrides, message, data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    args = [*BASE, f"data.paths=[{data_dir}]", "eval.every_steps=0", f"log.run_dir={tmp_path / 'run'}", *overrides]
    start = time.perf_counter()
    assert main(["configs/experiments/quickstart.yaml", *args]) == 2
    assert time.perf_counter() - start < 5
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_run_dir_that_is_a_file_and_messages_only_on_rank_0(data_dir, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    args = [*BASE, f"data.paths=[{data_dir}]", "eval.every_steps=0", f"log.run_dir={tmp_path / 'file'}"]
    assert main(["configs/experiments/quickstart.yaml", *args]) == 2
    assert capsys.readouterr().err == ""  # rank 1 stays quiet
    monkeypatch.setenv("RANK", "0")
    assert main(["configs/experiments/quickstart.yaml", *args]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def _bad_files(tmp_path):
    """(config path, message) for config files that are not readable YAML mappings."""
    binary, latin, dup, directory = (tmp_path / n for n in ("bin.yaml", "latin.yaml", "dup.yaml", "dir.yaml"))
    binary.write_bytes(b"\x7fELF\x00\x01" * 64)
    latin.write_bytes(b"log:\n  name: caf\xe9\n")
    dup.write_text("model: recurrentgpt-debug\ntrain:\n  seed: 3\ntrain:\n  max_steps: 4\n")
    directory.mkdir()
    return [(binary, f"config file {binary} is binary"), (latin, f"config file {latin} is not UTF-8 text (line 2"),
            (dup, "duplicate key 'train' on line 4 (first on line 2)"), (directory, f"config file {directory} is a directory")]


def test_unreadable_config_files_exit_2_naming_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    for path, message in _bad_files(tmp_path):
        assert main([str(path), f"log.run_dir={tmp_path / 'run'}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("train: invalid config:") and message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_absurd_sizes_exit_2_before_anything_starts(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    args = [*BASE, f"data.paths=[{data_dir}]", f"log.run_dir={tmp_path / 'run'}", "model.d_model=1048576",
            "train.lr=.inf", "model.block_size=2000000"]
    assert main(["configs/experiments/quickstart.yaml", *args]) == 2
    err = capsys.readouterr().err
    for message in ("model.d_model=1048576 must be <= 65536", "train.lr=inf must be finite",
                    "model.block_size=2000000 must be <= 1048576"):
        assert message in err
    assert not (tmp_path / "run").exists()


def test_a_hostile_dataset_is_refused_before_any_process_starts(data_dir, tmp_path, monkeypatch, capsys):
    """A split whose index would make streaming write outside the dataset (or unpickle) is a
    config-time error naming the index, not a traceback on every rank."""
    import json
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(data_dir, bad)
    index = json.loads((bad / "train" / "index.json").read_text())
    index["shards"][0]["column_encodings"] = ["pkl"]
    (bad / "train" / "index.json").write_text(json.dumps(index))
    monkeypatch.setenv("WORLD_SIZE", "1")
    args = [*BASE, f"data.paths=[{bad}]", "eval.every_steps=0", f"log.run_dir={tmp_path / 'run'}"]
    assert main(["configs/experiments/quickstart.yaml", *args]) == 2
    err = capsys.readouterr().err
    assert f"{bad}/train/index.json shard 0" in err and "never pkl or json" in err
    assert not (tmp_path / "run").exists()
