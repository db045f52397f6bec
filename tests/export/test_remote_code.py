"""rgpt_dist.export.remote_code: transformers runs an export's shipped code only when the policy
allows it (auto: only this checkout's own code; never; trust), and evaluation goes through it."""
import json
import shutil

import pytest

from rgpt_dist.eval.harness import hf_model_args
from rgpt_dist.export.remote_code import RemoteCodeRefused, trust_remote_code


@pytest.fixture
def exports(tiny_hf_exports):
    """The shared tiny looped and dense exports (tests/export/conftest.py); copy one before changing it."""
    return tiny_hf_exports


def copy(exports, tmp_path, name="looped"):
    return shutil.copytree(exports / name, tmp_path / name)


def test_dense_needs_no_remote_code_and_ours_is_recognised(exports):
    assert trust_remote_code(exports / "dense", "auto") is False
    assert trust_remote_code(exports / "dense", "never") is False
    assert trust_remote_code(exports / "looped", "auto") is True
    assert hf_model_args(exports / "dense")["trust_remote_code"] is False
    assert hf_model_args(exports / "looped")["trust_remote_code"] is True


@pytest.mark.parametrize("tamper", ["edit", "extra", "tokenizer", "auto_map", "family"])
def test_code_that_is_not_ours_is_refused_unless_trusted(exports, tmp_path, tamper):
    hf = copy(exports, tmp_path)
    if tamper == "edit":
        with open(hf / "layers.py", "a") as f:
            f.write("open('/tmp/fired', 'w')\n")
        named = "layers.py"
    elif tamper == "extra":
        (hf / "tokenization_evil.py").write_text("import os\n")
        named = "tokenization_evil.py"
    elif tamper == "tokenizer":
        cfg = json.loads((hf / "tokenizer_config.json").read_text())
        (hf / "tokenizer_config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoTokenizer": ["x.Y", None]}}))
        named = "tokenizer_config.json auto_map"
    else:
        cfg = json.loads((hf / "config.json").read_text())
        cfg["auto_map" if tamper == "auto_map" else "family"] = \
            {"AutoModelForCausalLM": "evil/repo--modeling.X"} if tamper == "auto_map" else "no_such_family"
        (hf / "config.json").write_text(json.dumps(cfg))
        named = "auto_map" if tamper == "auto_map" else "no_such_family"
    with pytest.raises(RemoteCodeRefused, match=rf"not this checkout's \(.*{named}"):
        trust_remote_code(hf, "auto")
    with pytest.raises(RemoteCodeRefused, match="--remote-code never"):
        trust_remote_code(hf, "never")
    assert trust_remote_code(hf, "trust") is True


def test_rgpt_eval_lm_eval_refuses_foreign_code(exports, tmp_path, capsys):
    from launcher.eval import main

    hf = copy(exports, tmp_path)
    (hf / "noise.py").write_text((hf / "noise.py").read_text() + "\nimport os\n")
    assert main(["lm-eval", str(hf), "--out", str(tmp_path / "out"), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    out = tmp_path / "out"
    assert "noise.py" in err and "refusing to run it" in err and not (out.exists() and any(out.iterdir()))
    assert main(["lm-eval", str(exports / "looped"), "--out", str(tmp_path / "out"), "--limit", "1",
                 "--remote-code", "never"]) == 2
    assert "--remote-code never" in capsys.readouterr().err


# -- sizes a trusted export's config.json asks for, bounded by its weights (rgpt_dist.export.config_bounds) --

@pytest.fixture(scope="module")
def rt_export(tmp_path_factory):
    """A tiny RT export (3 layers, d_model 64, untied head) as rgpt-export writes it: its code is ours."""
    import torch  # noqa: F401  (build_model needs it loaded)
    from rgpt_dist.export.hf_looped_writer import write_hf_looped
    from rgpt_dist.models.spec import spec_for
    from rgpt_dist.registry import build_model

    spec = spec_for("rt")
    cfg = spec.config(**{**spec.flavours["rt-debug"], "vocab_size": 300, "pad_vocab_multiple": 128, "block_size": 64})
    return write_hf_looped(build_model(cfg, seed=0).state_dict(), cfg, tmp_path_factory.mktemp("hf") / "rt")


def edited(src, tmp_path, drop_from_native=(), **changes):
    hf = shutil.copytree(src, tmp_path / "edited")
    cfg = json.loads((hf / "config.json").read_text())
    cfg["native_fields"] = [f for f in cfg["native_fields"] if f not in drop_from_native]
    (hf / "config.json").write_text(json.dumps({**cfg, **changes}))
    return hf


HOSTILE = {  # config.json edits -> what the refusal names (config.json and the field, and what the weights hold)
    "300,000 layers": ({"n_layer": 300_000}, ["n_layer = 300000", "holds 30 tensors in all"]),
    "d_model 2^22": ({"d_model": 2**22}, ["d_model = 4194304", "model.embed.wte.weight", "width 64"]),
    "vocabulary": ({"vocab_size": 2**20}, ["vocab_size = 1048576", "the weights hold 384 rows"]),
    "one layer more": ({"n_layer": 4, "num_hidden_layers": 4}, ["4 model.layers.N (n_layer = 4)", "holds 3"]),
    "MLP width": ({"d_ff": 2**17}, ["d_ff = 131072", "model.layers.0.mlp.fc.weight", "shape [256, 64]"]),
    "num_hidden_layers": ({"num_hidden_layers": 10**9}, ["num_hidden_layers = 1000000000", "runs 3 blocks"]),
    "block_size": ({"block_size": 2**30}, ["block_size=1073741824 must be <= 1048576"]),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_sizes_beyond_the_weights_are_refused_though_the_code_is_ours(rt_export, tmp_path, case):
    """The issue's RT export: byte-identical code (auto trusts it), a config.json asking for more than
    model.safetensors holds. Refused before anything is built, naming config.json, the field and the weights."""
    changes, named = HOSTILE[case]
    hf = edited(rt_export, tmp_path, **changes)
    assert trust_remote_code(rt_export, "auto") is True  # the clean export: its sizes are its weights'
    with pytest.raises(ValueError) as e:
        trust_remote_code(hf, "auto")
    assert type(e.value).__name__ == "ConfigBoundsRefused" and f"{hf}/config.json" in str(e.value)
    for text in named:
        assert text in str(e.value), str(e.value)
    assert trust_remote_code(hf, "trust") is True  # UNSAFE by name: nothing is checked


def test_a_field_left_out_of_native_fields_is_still_bounded(rt_export, tmp_path):
    """RGPTConfig hands config.json's other keys to the model too: d_ff counts whether listed or not."""
    hf = edited(rt_export, tmp_path, drop_from_native=("d_ff",), d_ff=2**17)
    with pytest.raises(ValueError, match=r"d_ff = 131072.*shape \[256, 64\]"):
        trust_remote_code(hf, "auto")


def test_a_looped_export_is_bounded_by_its_blocks(exports, tmp_path):
    hf = edited(exports / "looped", tmp_path, n_rec=300_000)
    with pytest.raises(ValueError, match=r"config.json asks for 300002 transformer blocks \(n_pre = 1, n_rec = 300000, "
                                         r"n_coda = 1\) but .*model.safetensors holds \d+ tensors"):
        trust_remote_code(hf, "auto")


def test_a_weights_header_that_its_data_does_not_back_is_refused(rt_export, tmp_path):
    """Only the header is read, its length bounded; a shape must be backed by its bytes in the file (a header
    claiming [2^22, 64] for the embedding, within a file of a few hundred KiB, would pass a shape check)."""
    hf = edited(rt_export, tmp_path)
    raw = (hf / "model.safetensors").read_bytes()
    (hf / "model.safetensors").write_bytes((2**62).to_bytes(8, "little") + raw[8:])
    with pytest.raises(ValueError, match=r"is not a safetensors file \(header length 4611686018427387904"):
        trust_remote_code(hf, "auto")
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["model.embed.wte.weight"]["shape"] = [2**22, 64]
    text = json.dumps(header).encode()
    (hf / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    with pytest.raises(ValueError, match=r"'model.embed.wte.weight' of shape \[4194304, 64\] .* has data_offsets"):
        trust_remote_code(hf, "auto")


def test_the_load_path_refuses_before_transformers_builds_anything(rt_export, tmp_path, monkeypatch):
    """load_hf_scorer (rgpt-eval lm-eval's own scoring) and lm-eval's model_args go through hf_model_args:
    the refusal comes before from_pretrained (which would build 300,000 layers)."""
    import transformers

    from rgpt_dist.eval.scoring import load_hf_scorer

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer, transformers.AutoConfig):
        monkeypatch.setattr(cls, "from_pretrained", lambda *a, **k: pytest.fail("transformers loaded the export"))
    hf = edited(rt_export, tmp_path, n_layer=300_000)
    with pytest.raises(ValueError, match=r"n_layer = 300000"):
        load_hf_scorer(hf)
    with pytest.raises(ValueError, match=r"n_layer = 300000"):
        hf_model_args(hf)


def test_rgpt_eval_lm_eval_refuses_hostile_sizes(exports, tmp_path, capsys, monkeypatch):
    import transformers

    from launcher.eval import main

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("transformers loaded the export"))
    hf = edited(exports / "looped", tmp_path, d_model=2**22, n_head=4)
    assert main(["lm-eval", str(hf), "--out", str(tmp_path / "out"), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    out = tmp_path / "out"
    assert "config.json asks for d_model = 4194304" in err and "width 32" in err and not (out.exists() and any(out.iterdir()))
