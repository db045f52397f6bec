"""Every route by which transformers' from_pretrained (config, tokenizer, model), as rgpt-eval calls it,
could reach code or files outside a checked export under the default policy (--remote-code auto).

Each test plants one route in a copy of a real export and loads it the way `rgpt-eval lm-eval` does
(rgpt_dist.eval.scoring.load_hf_scorer: hf_model_args, then AutoTokenizer and AutoModelForCausalLM):
the load must be refused with a message naming the file (and key), and planted code, where there is
some, must not have run (it writes a marker file on import)."""
import json
import os
import shutil
import threading

import pytest
from safetensors.torch import load_file

from rgpt_dist.eval.harness import hf_model_args
from rgpt_dist.eval.scoring import load_hf_scorer
from rgpt_dist.export.remote_code import RemoteCodeRefused, trust_remote_code

pytestmark = pytest.mark.usefixtures("hf_env")  # transformers' module copies in a temporary HF_HOME, offline


@pytest.fixture
def exports(tiny_hf_exports):
    """The shared tiny looped and dense exports (tests/export/conftest.py); copy one before changing it."""
    return tiny_hf_exports


def copy(exports, tmp_path, name):
    return shutil.copytree(exports / name, tmp_path / name)


def planted(exports, tmp_path, marker):
    """A directory outside the export: a looped export whose configuration module writes `marker` when imported."""
    other = copy(exports, tmp_path / "elsewhere", "looped")
    with open(other / "configuration_rgpt.py", "a") as f:
        f.write(f"\nopen({str(marker)!r}, 'w').close()\n")
    return other


def edit_json(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}, indent=2))


def refused(hf, *named):
    """Loading hf as rgpt-eval does is refused, naming each of `named`."""
    with pytest.raises(RemoteCodeRefused) as e:
        load_hf_scorer(hf)
    for text in named:
        assert text in str(e.value), str(e.value)
    return str(e.value)


def test_adapter_config_redirect(exports, tmp_path):
    """peft's adapter_config.json makes from_pretrained load base_model_name_or_path (and its code) instead."""
    marker = tmp_path / "fired"
    hf = copy(exports, tmp_path, "looped")
    base = planted(exports, tmp_path, marker)
    (hf / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base), "peft_type": "LORA"}))
    refused(hf, "adapter_config.json", "base_model_name_or_path")
    with pytest.raises(RemoteCodeRefused, match="adapter_config.json"):
        trust_remote_code(hf, "never")
    assert not marker.exists()


def test_tokenizer_code_from_another_directory(exports, tmp_path):
    """tokenizer_config.json's auto_map "DIR--module.Class" imports DIR/module.py; the key spelled with a JSON
    escape (auto\\u005fmap) is the same key to transformers."""
    marker = tmp_path / "fired"
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "tok.py").write_text(f"from transformers import PreTrainedTokenizerFast\n"
                                  f"open({str(marker)!r}, 'w').close()\n"
                                  "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    hf = copy(exports, tmp_path, "looped")
    cfg = json.loads((hf / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": [f"{other}--tok.EvilTokenizer", None]}
    (hf / "tokenizer_config.json").write_text(json.dumps(cfg).replace('"auto_map"', '"auto\\u005fmap"'))
    refused(hf, "tokenizer_config.json", "auto_map")
    assert not marker.exists()


def test_custom_generate_runs_without_trust_remote_code(exports, tmp_path):
    """from_pretrained imports a local custom_generate/generate.py whatever trust_remote_code says."""
    marker = tmp_path / "fired"
    hf = copy(exports, tmp_path, "dense")
    (hf / "custom_generate").mkdir()
    (hf / "custom_generate" / "generate.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n\ndef generate(model, *args, **kwargs):\n    return None\n")
    refused(hf, "custom_generate")
    with pytest.raises(RemoteCodeRefused, match="custom_generate"):
        trust_remote_code(hf, "never")
    assert not marker.exists()


def test_configuration_files_switch_config(exports, tmp_path):
    """config.json's configuration_files makes transformers read config.<version>.json instead: its auto_map
    (another directory's code) is never seen by a check of config.json."""
    marker = tmp_path / "fired"
    hf = copy(exports, tmp_path, "looped")
    other = planted(exports, tmp_path, marker)
    cfg = json.loads((hf / "config.json").read_text())
    swapped = {"AutoConfig": f"{other}--configuration_rgpt.RGPTConfig",
               "AutoModelForCausalLM": f"{other}--modeling_rgpt.RGPTForCausalLM"}
    (hf / "config.4.0.0.json").write_text(json.dumps({**cfg, "auto_map": swapped}))
    edit_json(hf / "config.json", configuration_files=["config.4.0.0.json"])
    refused(hf, "config.4.0.0.json", "config.json key 'configuration_files'")
    assert not marker.exists()


@pytest.mark.parametrize("key", ["tokenizer_file", "fast_tokenizer_files"])
def test_tokenizer_config_names_a_file_outside(exports, tmp_path, key):
    """tokenizer_config.json's tokenizer_file (any path, kept over the export's own tokenizer.json) and
    fast_tokenizer_files (a name joined to the directory: ../ leaves it) make transformers read another file."""
    hf = copy(exports, tmp_path, "dense")
    (tmp_path / "outside").mkdir()
    shutil.copyfile(hf / "tokenizer.json", tmp_path / "outside" / "tokenizer.1.0.json")
    value = str(tmp_path / "outside" / "tokenizer.1.0.json") if key == "tokenizer_file" else \
        ["../outside/tokenizer.1.0.json"]
    edit_json(hf / "tokenizer_config.json", **{key: value})
    refused(hf, "tokenizer_config.json", key)


def test_transformers_weights_names_a_file_outside(exports, tmp_path):
    """config.json's transformers_weights is joined to the directory and loaded as the weights."""
    hf = copy(exports, tmp_path, "dense")
    (tmp_path / "outside").mkdir()
    shutil.copyfile(hf / "model.safetensors", tmp_path / "outside" / "model.safetensors")
    edit_json(hf / "config.json", transformers_weights="../outside/model.safetensors")
    refused(hf, "config.json", "transformers_weights")


def test_shard_index_names_a_file_outside(exports, tmp_path):
    """model.safetensors.index.json's weight_map values are joined to the directory: ../ leaves it."""
    hf = copy(exports, tmp_path, "dense")
    (tmp_path / "outside").mkdir()
    shutil.move(hf / "model.safetensors", tmp_path / "outside" / "model.safetensors")
    keys = load_file(tmp_path / "outside" / "model.safetensors")
    (hf / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "../outside/model.safetensors" for k in keys}}))
    refused(hf, "model.safetensors.index.json", "weight_map", "../outside/model.safetensors")


def test_symbolic_link_out_of_the_export(exports, tmp_path):
    """A link inside the export is followed by every reader: the weights would come from anywhere."""
    hf = copy(exports, tmp_path, "dense")
    (tmp_path / "outside").mkdir()
    shutil.move(hf / "model.safetensors", tmp_path / "outside" / "model.safetensors")
    (hf / "model.safetensors").symlink_to(tmp_path / "outside" / "model.safetensors")
    refused(hf, "model.safetensors", "symbolic link")


def test_fifo_is_refused_without_reading_it(exports, tmp_path):
    """A FIFO in place of a code file: reading it (to compare the code) would block forever."""
    hf = copy(exports, tmp_path, "looped")
    (hf / "layers.py").unlink()
    os.mkfifo(hf / "layers.py")
    outcome = {}

    def check():
        try:
            trust_remote_code(hf, "auto")
        except RemoteCodeRefused as e:
            outcome["error"] = str(e)

    t = threading.Thread(target=check, daemon=True)
    t.start()
    t.join(20)
    hung = t.is_alive()
    if hung:  # unblock the reader (end of file) so that the thread ends
        os.close(os.open(hf / "layers.py", os.O_WRONLY | os.O_NONBLOCK))
        t.join()
    assert not hung, "the check blocked reading a FIFO"
    assert "layers.py" in outcome.get("error", "") and "not a regular file" in outcome["error"]


@pytest.mark.parametrize("name", ["pytorch_model.bin", "preprocessor_config.json"])
def test_file_rgpt_export_never_writes(exports, tmp_path, name):
    """Anything but the files rgpt-export writes is refused: pickled weights, a processor config (auto_map)."""
    hf = copy(exports, tmp_path, "dense")
    (hf / name).write_text(json.dumps({"auto_map": {"AutoProcessor": "evil/repo--proc.P"}}))
    refused(hf, name, "not a file rgpt-export writes")


@pytest.mark.parametrize("key", ["custom_pipelines", "_name_or_path", "model_type"])
def test_config_key_naming_other_code(exports, tmp_path, key):
    """config.json keys that name code or a model elsewhere (pipelines, the path the config came from) or
    another architecture than rgpt-export's (gpt_bigcode, which reads GPT-2's field names: loaded unchecked it
    builds a small model, where e.g. llama's defaults would allocate 7B parameters)."""
    hf = copy(exports, tmp_path, "dense")
    value = {"custom_pipelines": {"text-generation": {"impl": "evil/repo--pipe.P", "pt": ["AutoModelForCausalLM"]}},
             "_name_or_path": str(tmp_path / "elsewhere"), "model_type": "gpt_bigcode"}[key]
    edit_json(hf / "config.json", **{key: value})
    refused(hf, "config.json", repr(key))


def test_clean_exports_still_load_and_trust_is_unchanged(exports, tmp_path):
    """The exports rgpt-export writes load under auto (local files and safetensors only); trust still
    runs whatever the export ships."""
    for name in ("dense", "looped"):
        _, tok, max_length = load_hf_scorer(exports / name)
        assert max_length == 32 and tok("a b").input_ids
        args = hf_model_args(exports / name)
        assert args["local_files_only"] is True and args["use_safetensors"] is True
    hf = copy(exports, tmp_path, "looped")
    (hf / "extra.py").write_text("import os\n")
    assert trust_remote_code(hf, "trust") is True
    # as downloaded from a hub (snapshot_download(local_dir=...)): a model card and the download records
    hub = copy(exports, tmp_path, "dense")
    (hub / "README.md").write_text("# a model card\n")
    (hub / ".cache" / "huggingface").mkdir(parents=True)
    assert trust_remote_code(hub, "auto") is False and trust_remote_code(hub, "never") is False


def test_rgpt_eval_lm_eval_refuses_a_route(exports, tmp_path, capsys):
    from launcher.eval import main

    marker = tmp_path / "fired"
    hf = copy(exports, tmp_path, "looped")
    base = planted(exports, tmp_path, marker)
    (hf / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base), "peft_type": "LORA"}))
    assert main(["lm-eval", str(hf), "--out", str(tmp_path / "out"), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "adapter_config.json" in err and "Traceback" not in err and not marker.exists()


def test_rgpt_eval_lm_eval_refuses_an_export_whose_hf_is_a_link(exports, tmp_path, capsys):
    """EXPORT/hf as a link: the check would list the link's target, which can change under it."""
    from launcher.eval import main

    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "hf").symlink_to(copy(exports, tmp_path, "looped"))
    assert main(["lm-eval", str(tmp_path / "export"), "--out", str(tmp_path / "out"), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'export' / 'hf'} is a symbolic link: refusing" in err and "Traceback" not in err
