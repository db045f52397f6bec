"""Config files that are not text, repeated keys, and sizes that cannot run: each is one clean
ConfigError naming the file (and line) or the field and value, never a traceback or a silent drop."""
import os
import sys

import pytest

from rgpt_dist.config import ConfigError, field_docs, load_config
from rgpt_dist.models.config import LoopedConfig, ModelConfig
from rgpt_dist.config.run import DataConfig
from rgpt_dist.config.train import TrainConfig


def _error(source, overrides=()) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(source, list(overrides))
    return str(err.value)


# ---- files that are not YAML text -----------------------------------------------------------
def test_binary_non_utf8_and_directory_files_name_the_file(tmp_path):
    binary = tmp_path / "model.yaml"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)))
    assert f"config file {binary} is binary (a NUL byte at offset 7)" in _error(binary)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("train:\n  seed: 1\nlog:\n  name: caf\u00e9\n".encode("latin-1"))
    assert f"config file {latin} is not UTF-8 text (line 4, byte 33: b'\\xe9')" in _error(latin)
    for directory in (tmp_path / "dir.yaml", tmp_path / "plain_dir"):
        directory.mkdir()
        assert f"config file {directory} is a directory" in _error(directory)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    assert f"config file {fifo} is not a regular file" in _error(fifo)


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_names_the_file(tmp_path):
    secret = tmp_path / "secret.yaml"
    secret.write_text("train:\n  seed: 1\n")
    secret.chmod(0)
    assert f"config file {secret} cannot be read: Permission denied" in _error(secret)


def test_an_oversized_file_is_not_read_whole(tmp_path):
    from rgpt_dist.sections import MAX_CONFIG_BYTES
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    assert "is larger than 16 MiB" in _error(big)


def test_a_name_the_os_refuses_is_a_config_error():
    assert "cannot be looked up" in _error("x" * 5000)


# ---- repeated keys ----------------------------------------------------------------------------
def test_a_duplicated_top_level_section_names_the_key_and_both_lines(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("model: recurrentgpt-debug\ntrain:\n  lr: 0.001\n  seed: 3\nlog:\n  every_steps: 5\ntrain:\n"
                 "  max_steps: 10\n")
    message = _error(f)
    assert f"config file {f} is not valid YAML" in message
    assert "duplicate key 'train' on line 7 (first on line 2)" in message


def test_a_duplicated_nested_key_is_an_error_too(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("model:\n  flavour: recurrentgpt-debug\n  n_loops: 4\n  n_loops: 6\n")
    assert "duplicate key 'n_loops' on line 4 (first on line 3)" in _error(f)
    assert "duplicate key 'a' on line 1 (first on line 1)" in _error("recurrentgpt-debug", ["log.name={a: 1, a: 2}"])


def test_merge_keys_may_still_be_overridden():
    """`<<: *anchor` then a key of the anchor is YAML's override idiom, not a duplicate."""
    from rgpt_dist.sections import load_yaml
    assert load_yaml("a: &t {lr: 1, seed: 4}\nb:\n  <<: *t\n  seed: 5\n")["b"] == {"lr": 1, "seed": 5}


# ---- sizes and rates that cannot run ----------------------------------------------------------
TOO_BIG = [
    ("recurrentgpt-debug", ["train.seq_len=1000000000"], "train.seq_len=1000000000 must be <= 1048576"),
    ("recurrentgpt-debug", ["model.d_model=1048576"], "model.d_model=1048576 must be <= 65536"),
    ("recurrentgpt-debug", ["model.vocab_size=1048577"], "model.vocab_size=1048577 must be <= 1048576"),
    ("recurrentgpt-debug", ["model.block_size=1048577"], "model.block_size=1048577 must be <= 1048576"),
    ("recurrentgpt-debug", ["model.pad_vocab_multiple=65537"], "model.pad_vocab_multiple=65537 must be <= 65536"),
    ("recurrentgpt-debug", ["model.n_loops=1025", "model.r_min=1"], "model.n_loops=1025 must be <= 1024"),
    ("recurrentgpt-debug", ["model.n_rec=1025"], "model.n_rec=1025 must be <= 1024"),
    ("recurrentgpt-debug", ["model.n_pre=600", "model.n_coda=600"],
     "model: 1201 transformer blocks (600+1x2+600) exceed the bound of 1024"),
    ("gpt2-debug", ["model.n_layer=5000"], "model: 5000 transformer blocks (5000L) exceed the bound of 1024"),
    ("recurrentgpt-debug", ["train.micro_batch_size=65537", "train.global_batch_size=65537"],
     "train.micro_batch_size=65537 must be <= 65536"),
    ("recurrentgpt-debug", ["train.global_batch_size=16777224"], "train.global_batch_size=16777224 must be <= 16777216"),
    ("recurrentgpt-debug", ["train.max_steps=1000000001"], "train.max_steps=1000000001 must be <= 1000000000"),
    ("recurrentgpt-debug", ["train.lr=2.0"], "train.lr=2.0 must be <= 1.0"),
    ("recurrentgpt-debug", ["train.seed=-1"], "train.seed=-1 must be >= 0"),
    ("recurrentgpt-debug", ["train.seed=4294967296"], "train.seed=4294967296 must be <= 4294967295"),
    ("recurrentgpt-debug", ["data.num_workers=100000"], "data.num_workers=100000 must be <= 256"),
]


@pytest.mark.parametrize("source,overrides,message", TOO_BIG, ids=[m[:40] for *_, m in TOO_BIG])
def test_sizes_that_cannot_run_are_refused_naming_the_value(source, overrides, message):
    assert message in _error(source, overrides)


NOT_FINITE = [("train.lr", ".inf"), ("train.lr", "inf"), ("train.lr", ".nan"), ("train.min_lr", ".nan"),
              ("train.weight_decay", ".inf"), ("train.grad_clip", ".nan"), ("train.beta1", ".nan"),
              ("model.ln_eps", ".inf"), ("model.init_std", ".nan"), ("model.tau", ".inf"),
              ("model.gate_bias_init", ".nan")]  # a family field no section bounds: caught generically


@pytest.mark.parametrize("key,value", NOT_FINITE, ids=[f"{k}={v}" for k, v in NOT_FINITE])
def test_non_finite_floats_are_refused_once(key, value):
    with pytest.raises(ConfigError) as err:
        load_config("recurrentgpt-debug", [f"{key}={value}"])
    finite = [p for p in err.value.problems if p.endswith("must be finite")]
    assert len(finite) == 1 and finite[0].startswith(f"{key}=") and finite[0].split("=")[1].split()[0] in ("inf", "nan")


def test_values_at_the_bounds_are_accepted():
    cfg = load_config("gpt2-debug", ["model.n_layer=1024", "model.d_model=65536", "model.n_head=4",
                                     "model.vocab_size=1048576", "model.block_size=1048576", "train.seq_len=1048576",
                                     "train.lr=1.0", "train.seed=4294967295", "train.max_steps=1000000000",
                                     "data.num_workers=256"])
    assert (cfg.model.n_layer, cfg.train.seq_len, cfg.train.lr) == (1024, 2**20, 1.0)


BOUNDS_DOCUMENTED = [(TrainConfig, "seq_len", "2^20"), (TrainConfig, "micro_batch_size", "2^16"),
                     (TrainConfig, "global_batch_size", "2^24"), (TrainConfig, "max_steps", "10^9"),
                     (TrainConfig, "lr", "lr <= 1.0"), (TrainConfig, "seed", "2^32 - 1"),
                     (ModelConfig, "vocab_size", "2^20"), (ModelConfig, "block_size", "2^20"),
                     (ModelConfig, "d_model", "2^16"), (ModelConfig, "pad_vocab_multiple", "2^16"),
                     (LoopedConfig, "n_loops", "1024"), (LoopedConfig, "n_rec", "1024"),
                     (LoopedConfig, "n_pre", "1024"), (LoopedConfig, "n_coda", "1024"),
                     (DataConfig, "num_workers", "256")]


@pytest.mark.parametrize("cls,field,bound", BOUNDS_DOCUMENTED, ids=[f"{c.__name__}.{f}" for c, f, _ in BOUNDS_DOCUMENTED])
def test_each_bound_is_in_its_field_docstring(cls, field, bound):
    assert bound in field_docs(cls)[field]



# ---- YAML aliases: a "billion laughs" document is refused before any value is built -----------
def _laughs(levels: int = 9, width: int = 10) -> str:
    """a: 10 strings; b: 10 x a; ...: `levels` levels of aliases expand to width**levels strings."""
    names = [f"l{i}" for i in range(levels)]
    text = f"{names[0]}: &{names[0]} [{', '.join(['lol'] * width)}]\n"
    for prev, name in zip(names, names[1:]):
        text += f"{name}: &{name} [{', '.join(['*' + prev] * width)}]\n"
    return text + f"log:\n  name: *{names[-1]}\n"


def test_an_alias_bomb_config_is_refused_fast_in_bounded_memory(tmp_path, capsys):
    import time
    import tracemalloc

    from launcher.train import main
    bomb = tmp_path / "laughs.yaml"
    bomb.write_text(_laughs())
    tracemalloc.start()
    start = time.perf_counter()
    try:
        message = _error(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 2 and peak < 20 << 20
    assert f"config file {bomb} is not valid YAML" in message
    assert "expands to more than 100000 nodes through aliases (*name): refusing to load it" in message
    assert len(message) < 1000 and "lol, lol, lol, lol, lol" not in message  # the value is never printed
    assert main([str(bomb)]) == 2
    err = capsys.readouterr().err
    assert f"config file {bomb} is not valid YAML" in err and len(err) < 1000


def test_a_recursive_alias_and_a_bomb_in_an_override_are_refused(tmp_path):
    loop = tmp_path / "loop.yaml"
    loop.write_text("log:\n  name: &n [a, *n]\n")
    assert "an alias refers to the value that contains it (a recursive value)" in _error(loop)
    small = "[" + ", ".join(["&x [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"] + ["*x"] * 9) + "]"  # 110 nodes: fine,
    message = _error("recurrentgpt-debug", [f"log.name={small}"])             # and printed cut short
    assert "log.name=[[1, 2, 3, 4, 5, 6, 7, 8, ...], [1, 2, 3" in message and len(message) < 500
    flow = "{" + ", ".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "lol"] * 10) + "]"
                           for i in range(9)) + "}"  # the same bomb in flow style, on one line
    assert "expands to more than 100000 nodes" in _error("recurrentgpt-debug", [f"log.name={flow}"])
