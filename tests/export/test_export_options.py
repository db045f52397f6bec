"""rgpt-export's `--dtype bf16`, `--r-eval` and `--kv-strategy` (launcher/export.py) on a trained
RecurrentGPT checkpoint (the shared `runs` of tests/export/conftest.py): each lands in the export's
records and changes what the exported model does."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from rgpt_dist.checkpoints.native import load_native
from tests.helpers.dist import ROOT

pytestmark = pytest.mark.slow


def export_cli(*args):
    return subprocess.run([sys.executable, "-m", "launcher.export", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}, timeout=600)


@pytest.fixture(scope="module")
def exports(runs, tmp_path_factory):
    """The same checkpoint exported with the defaults and with every option."""
    root = tmp_path_factory.mktemp("options")
    out = {"default": root / "default", "options": root / "options"}
    assert export_cli(runs["zero2-trained"], out["default"]).returncode == 0
    done = export_cli(runs["zero2-trained"], out["options"], "--dtype", "bf16", "--r-eval", "2",
                      "--kv-strategy", "average")
    assert done.returncode == 0, done.stderr
    return out


def test_options_are_recorded(exports):
    """hf/config.json carries r_eval, kv_strategy and the dtype; export.json and native/config.json
    record them; the defaults are R, full and fp32."""
    hf = {k: json.loads((exports[k] / "hf" / "config.json").read_text()) for k in exports}
    dtype = {k: hf[k].get("dtype", hf[k].get("torch_dtype")) for k in hf}
    assert (hf["options"]["r_eval"], hf["options"]["kv_strategy"], dtype["options"]) == (2, "average", "bfloat16")
    assert (hf["default"]["r_eval"], hf["default"]["kv_strategy"], dtype["default"]) == (4, "full", "float32")
    record = json.loads((exports["options"] / "export.json").read_text())
    assert record["dtype"] == "bf16" and record["inference"] == {"r_eval": 2, "kv_strategy": "average"}
    assert json.loads((exports["options"] / "native" / "config.json").read_text())["dtype"] == "bfloat16"


def test_bf16_stores_the_fp32_weights_rounded(exports):
    """Every stored tensor of both parts is bf16 and is the fp32 export's tensor rounded to bf16 (the
    native part under the native names, the HF part under `model.`)."""
    for part, prefix in (("native", ""), ("hf", "model.")):
        fp32 = load_file(str(exports["default"] / part / "model.safetensors"))
        bf16 = load_file(str(exports["options"] / part / "model.safetensors"))
        assert bf16.keys() == fp32.keys() and any(k.startswith(prefix) for k in bf16)
        for k, v in bf16.items():
            assert v.dtype == torch.bfloat16 and torch.equal(v, fp32[k].bfloat16()), (part, k)
        assert any(not torch.equal(v.float(), fp32[k]) for k, v in bf16.items())  # rounding happened


def test_hf_model_runs_at_r_eval_with_the_kv_strategy(exports, hf_env):
    """Loaded without overrides, the bf16/R*=2/average export computes the native model's logits at
    depth 2 with the bf16-rounded weights (not depth R), and its cache holds one K/V per token per
    core block (average) instead of one per step (full, the default export's)."""
    from transformers import AutoModelForCausalLM

    native, _ = load_native(exports["options"] / "native")  # fp32 compute of the bf16 weights
    ids = torch.randint(0, native.cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    models = {k: AutoModelForCausalLM.from_pretrained(exports[k] / "hf", trust_remote_code=True,
                                                      dtype=torch.float32).eval() for k in exports}
    V = native.cfg.vocab_size
    with torch.no_grad():
        at2, atR = native(ids, r=2).logits[..., :V], native(ids, r=native.cfg.n_loops).logits[..., :V]
        out = models["options"](ids, use_cache=True)
        default = models["default"](ids, use_cache=True)
    assert (out.logits - at2).abs().max() < 1e-5
    assert (at2 - atR).abs().max() > 1e-3  # depth 2 is not depth R: the comparison tells them apart
    cache, full = out.past_key_values, default.past_key_values
    assert (cache.r, cache.strategy, full.r, full.strategy) == (2, "average", 4, "full")
    cfg = native.cfg
    per_layer = full.nbytes() // (cfg.n_pre + cfg.n_coda + cfg.n_rec * 4)
    assert cache.nbytes() == per_layer * (cfg.n_pre + cfg.n_coda + cfg.n_rec)
