"""transformers' remote-code module cache kept out of ~/.cache, offline, for tests that load exports."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest


def _remote_modules() -> list[str]:
    return [k for k in sys.modules if k == "transformers_modules" or k.startswith("transformers_modules.")]


@contextlib.contextmanager
def isolated_hf(home: Path):
    """HF_HOME and HF_MODULES_CACHE under `home`, downloads off. transformers reads HF_MODULES_CACHE
    once at import, so the loaded module is patched too; `transformers_modules` packages an earlier
    test imported from another cache are hidden, and ours removed afterwards."""
    import transformers.dynamic_module_utils as dmu

    modules = str(home / "modules")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            mp.setenv(var, "1")
        mp.setenv("HF_HOME", str(home))
        mp.setenv("HF_MODULES_CACHE", modules)
        mp.setattr(dmu, "HF_MODULES_CACHE", modules)
        for k in _remote_modules():
            mp.delitem(sys.modules, k)
        yield home
        for k in _remote_modules():
            del sys.modules[k]
    if modules in sys.path:
        sys.path.remove(modules)


def load_remote(path, **overrides):
    """An export loaded with its shipped code (trust_remote_code), in eval mode."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, **overrides).eval()


def greedy(model, ids, n, **kw):
    """`generate()` of exactly n greedy tokens on an unpadded batch, with the scores of each."""
    import torch
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_scores=True, **kw)
