"""The model section's layers: a flavour named at any level rebuilds the section from that flavour
(family included), then the YAML's own model fields apply, then the command line's (#11)."""
from __future__ import annotations

from pathlib import Path

import pytest

from rgpt_dist.models.flavours import write_yaml
from rgpt_dist.config import ConfigError, GPT2Config, RecurrentGPTConfig, load_config


def _yaml(tmp_path, model_yaml: str):
    f = tmp_path / "exp.yaml"
    f.write_text(model_yaml + "train:\n  seq_len: 32\n")
    return f


# (YAML model section, command line) -> expected (class, d_model, distinguishing field)
@pytest.mark.parametrize("yaml_model, cli", [
    ("model: recurrentgpt-small-isoflops\n", ["model.flavour=recurrentgpt-debug"]),
    ("model: recurrentgpt-small-isoflops\n", ["model=recurrentgpt-debug"]),
    ("model:\n  flavour: recurrentgpt-small-isoflops\n", ["model.flavour=recurrentgpt-debug"]),
    ("model:\n  flavour: recurrentgpt-small-isoflops\n", ["model=recurrentgpt-debug"]),
    ("model: gpt2-debug\n", ["model=recurrentgpt-small-isoflops", "model.flavour=recurrentgpt-debug"]),
])
def test_command_line_flavour_wins_over_yaml_flavour(tmp_path, yaml_model, cli):
    cfg = load_config(_yaml(tmp_path, yaml_model), cli)
    assert isinstance(cfg.model, RecurrentGPTConfig)
    assert (cfg.model.d_model, cfg.model.n_loops) == (64, 2)  # recurrentgpt-debug, not the 768-wide model


def test_yaml_fields_apply_over_the_new_flavour_then_command_line_fields(tmp_path):
    f = _yaml(tmp_path, "model:\n  flavour: recurrentgpt-small-isoflops\n  n_loops: 4\n  sigma_x: 0.0\n")
    cfg = load_config(f, ["model.sigma_x=0.3", "model.flavour=recurrentgpt-debug"])
    assert (cfg.model.d_model, cfg.model.n_loops, cfg.model.sigma_x) == (64, 4, 0.3)


def test_command_line_flavour_switches_family_in_either_order():
    for overrides in (["model.flavour=gpt2-debug", "model.n_layer=3"], ["model.n_layer=3", "model=gpt2-debug"]):
        cfg = load_config("recurrentgpt-debug", overrides)
        assert isinstance(cfg.model, GPT2Config) and (cfg.model.n_layer, cfg.model.d_model) == (3, 64)
    cfg = load_config(None, ["model.n_layer=2", "model=gpt2-debug"])  # no source: the field survives too
    assert cfg.model.n_layer == 2


def test_field_the_new_family_lacks_names_field_and_both_flavours(tmp_path):
    f = _yaml(tmp_path, "model:\n  flavour: recurrentgpt-debug\n  n_loops: 4\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, ["model.flavour=gpt2-debug"])
    msg = str(e.value)
    for part in ("model.n_loops=4 (exp.yaml)", "GPT2Config", "gpt2-debug (command line)",
                 "replaced recurrentgpt-debug (exp.yaml)"):
        assert part in msg, msg
    with pytest.raises(ConfigError, match=r"model.n_layer=2 \(command line\) is not a field of RecurrentGPTConfig"):
        load_config("gpt2-debug", ["model=recurrentgpt-debug", "model.n_layer=2"])


def test_complete_yaml_model_section_is_replaced_by_a_command_line_flavour(tmp_path):
    f = _yaml(tmp_path, "model:\n  family: gpt2\n  d_model: 32\n  n_head: 2\n  n_layer: 1\n")
    assert load_config(f).model.d_model == 32
    cfg = load_config(f, ["model=recurrentgpt-debug"])
    assert isinstance(cfg.model, RecurrentGPTConfig) and cfg.model.d_model == 64


def test_the_shipped_configs_switch_from_the_command_line():
    cfg = load_config("configs/experiments/recurrentgpt-small-isoflops-20k.yaml", ["model.flavour=recurrentgpt-debug"])
    assert cfg.model.d_model == 64
    with pytest.raises(ConfigError, match="model.n_loops=4 .debug.yaml. is not a field of GPT2Config"):
        load_config("configs/experiments/debug.yaml", ["model.flavour=gpt2-debug"])
    cfg = load_config("configs/experiments/debug.yaml", ["model.n_loops=6"])
    assert cfg.model.n_loops == 6


def test_bad_flavour_and_nested_model_keys_are_errors():
    with pytest.raises(ConfigError, match="model='nope' is not a known flavour"):
        load_config(None, ["model.flavour=nope"])
    with pytest.raises(ConfigError, match="model fields are not nested"):
        load_config(None, ["model.a.b=1"])
    with pytest.raises(ConfigError, match="must name a flavour"):
        load_config(None, ["model=3"])


def test_the_committed_flavour_yamls_are_what_make_configs_writes(tmp_path):
    """configs/models/*.yaml are generated (`make configs`): a field added to a family's config shows
    up in them, so a stale file (the field missing, or a flavour gone) fails here."""
    committed = Path(__file__).resolve().parents[2] / "configs" / "models"
    written = {p.name: p.read_text() for p in write_yaml(tmp_path)}
    assert sorted(p.name for p in committed.glob("*.yaml")) == sorted(written)
    stale = [name for name, text in written.items() if (committed / name).read_text() != text]
    assert not stale, f"regenerate with `make configs`: {stale}"
