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
