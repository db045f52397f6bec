import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rgpt_dist.config import (FLAVOURS, Config, ConfigError, GPT2Config, RecurrentGPTConfig, field_docs,
                              from_dict, load_config)
from rgpt_dist.models.config import ModelConfig
from rgpt_dist.config.train import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
YAMLS = sorted((ROOT / "configs" / "models").glob("*.yaml"))


def test_every_flavour_has_a_yaml_and_vice_versa():
    assert {p.stem for p in YAMLS} == set(FLAVOURS)


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_flavour_yaml_loads_validates_and_equals_the_registry(path):
    from_file = load_config(path)
    assert from_file.model == load_config(path.stem).model
    assert from_file.model == from_dict(ModelConfig, FLAVOURS[path.stem])


def test_experiment_yaml_with_flavour_name_and_overrides(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump({"model": "recurrentgpt-debug", "train": {"seq_len": 128, "lr": 1e-3}}))
    cfg = load_config(f, ["model.n_loops=6", "train.micro_batch_size=2", "model.sigma_x=0"])
    assert isinstance(cfg.model, RecurrentGPTConfig)
    assert (cfg.model.n_loops, cfg.model.d_model, cfg.model.sigma_x) == (6, 64, 0.0)
    assert (cfg.train.seq_len, cfg.train.lr, cfg.train.micro_batch_size) == (128, 1e-3, 2)
    assert isinstance(cfg.model.sigma_x, float)  # ints widen to float fields


def test_exponent_floats_without_a_dot_are_floats(tmp_path):
    """PyYAML reads `3e-4` as a string (YAML 1.1); float fields accept it as the number it spells."""
    f = tmp_path / "exp.yaml"
    f.write_text("model: gpt2-debug\ntrain:\n  lr: 3e-4\n  min_lr: 3e-5\n")
    cfg = load_config(f, ["train.weight_decay=1e-2"])
    assert (cfg.train.lr, cfg.train.min_lr, cfg.train.weight_decay) == (3e-4, 3e-5, 1e-2)
    with pytest.raises(ConfigError, match="train.lr='fast' has the wrong type"):
        load_config(f, ["train.lr=fast"])


def test_flavour_with_field_overrides_in_yaml(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("model:\n  flavour: recurrentgpt-debug\n  n_loops: 4\n")
    cfg = load_config(f)
    assert cfg.model.n_loops == 4 and cfg.model.d_model == 64
    f.write_text("model:\n  flavour: recurrentgpt-debug\n  n_layer: 4\n")
    with pytest.raises(ConfigError, match=r"model.n_layer=4 \(exp.yaml\) is not a field of RecurrentGPTConfig"):
        load_config(f)


def test_override_switches_flavour_then_refines():
    cfg = load_config(None, ["model=gpt2-debug", "model.n_layer=2"])
    assert isinstance(cfg.model, GPT2Config) and cfg.model.n_layer == 2


def test_roundtrip_through_yaml():
    cfg = load_config("recurrentgpt-medium-isoparams", ["train.seed=42"])
    again = from_dict(Config, yaml.safe_load(cfg.to_yaml())).validate()
    assert again == cfg


BAD = [
    (["model.d_model=100", "model.n_head=12"], "model.d_model=100 is not divisible by model.n_head=12"),
    (["model.n_loops=0", "model.r_min=0"], "model.n_loops=0 must be >= 1"),
    (["model.r_min=5"], "model.r_min=5 must satisfy 1 <= r_min <= n_loops=2"),
    (["model.sigma_x=-0.1"], "model.sigma_x=-0.1 must be >= 0"),
    (["model.sigma_g=-1"], "model.sigma_g=-1.0 must be >= 0"),
    (["model.tau=0"], "model.tau=0.0 must be > 0"),
    (["train.seq_len=2048"], "train.seq_len=2048 exceeds model.block_size=1024"),
    (["model.n_rec=0"], "model.n_rec=0 must be > 0"),
    (["model.n_pre=-1"], "model.n_pre=-1 must be >= 0"),
    (["model.vocab_size=0"], "model.vocab_size=0 must be > 0"),
    (["model.depth_sampler=poisson"], "model.depth_sampler='poisson' is not one of ['uniform', 'fixed']"),
    (["model.n_loops=four"], "model.n_loops='four' has the wrong type (expected int)"),
    (["model.n_loops=2.5"], "model.n_loops=2.5 has the wrong type (expected int)"),
    (["model.bias=3"], "model.bias=3 has the wrong type (expected bool)"),
    (["model.n_layer=4"], "model.n_layer=4 (command line) is not a field of RecurrentGPTConfig"),
    (["model.family=moe"], "model.family='moe' is not one of"),
    (["model=gpt3-xl"], "model='gpt3-xl' is not a known flavour"),
    (["train.min_lr=1.0"], "train.min_lr=1.0 must not exceed train.lr=0.0006"),
    (["train.warmup_steps=30000"], "train.warmup_steps=30000 exceeds train.max_steps=20000"),
    (["train.beta2=1.0"], "train.beta2=1.0 must be in [0, 1)"),
    (["train.lr=-1"], "train.lr=-1.0 must be > 0"),
    (["train.sgd=1"], "train.sgd is not a field of TrainConfig"),
    (["model.ln_eps=0"], "model.ln_eps=0.0 must be > 0"),
    (["model.pad_vocab_multiple=0"], "model.pad_vocab_multiple=0 must be >= 1"),
    (["parallel.tp_size=3"], "model.n_head=4 is not divisible by parallel.tp_size=3"),
    (["parallel.tp_size=3"], "model.d_model=64 is not divisible by parallel.tp_size=3"),
    (["parallel.tp_size=2"], "the padded vocabulary 50257 (model.vocab_size=50257, model.pad_vocab_multiple=1) is not divisible by parallel.tp_size=2; use model.pad_vocab_multiple=256"),
    (["parallel.tp_size=0"], "parallel.tp_size=0 must be >= 1"),
    (["model.mlp=swiglu", "model.d_ff=341", "parallel.tp_size=2", "model.pad_vocab_multiple=256"],
     "model.d_ff=341 is not divisible by parallel.tp_size=2"),  # megatron would fail after process start
    (["no_equals_sign"], "override 'no_equals_sign' is not of the form key=value"),
    (["model.n_loops=[1"], "value is not valid YAML"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_config_names_field_and_value(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config("recurrentgpt-debug", overrides)
    assert message in str(err.value)


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as err:
        load_config("recurrentgpt-debug", ["model.tau=0", "model.sigma_x=-1", "train.seq_len=4096"])
    assert len(err.value.problems) == 3


def test_bad_yaml_files_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml does not exist"):
        load_config(missing)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="list.yaml must hold a mapping"):
        load_config(listy)
    with pytest.raises(ConfigError, match="neither a YAML file nor a flavour"):
        load_config("recurrentgpt-tiny")


def test_validation_runs_without_importing_torch():
    """Configs are checked before any model (or torch) exists: the config package never imports torch."""
    code = ("import sys\nfrom rgpt_dist.config import load_config, ConfigError\n"
            "try:\n    load_config('recurrentgpt-debug', ['model.tau=0'])\nexcept ConfigError as e:\n"
            "    print(e)\nprint('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert "model.tau=0.0 must be > 0" in out.stdout
    assert out.stdout.strip().endswith("False")


@pytest.mark.parametrize("cls", [ModelConfig, GPT2Config, RecurrentGPTConfig, TrainConfig, Config])
def test_every_field_has_a_docstring(cls):
    import dataclasses
    docs = field_docs(cls)
    assert [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)] == []
