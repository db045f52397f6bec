"""transformers' remote-code module cache, kept out of ~/.cache for every export test."""
import sys

import pytest


@pytest.fixture(scope="module")
def hf_env(tmp_path_factory):
    """transformers copies remote code into HF_MODULES_CACHE: point it (read when transformers is
    imported, so also patched in the loaded module) at a temporary directory, offline, and hide any
    `transformers_modules` package an earlier test imported from another cache."""
    import transformers.dynamic_module_utils as dmu

    modules = str(tmp_path_factory.mktemp("hf_modules"))
    hidden = {k: v for k, v in sys.modules.items() if k == "transformers_modules" or k.startswith("transformers_modules.")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_MODULES_CACHE", modules)
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(dmu, "HF_MODULES_CACHE", modules)
        for k in hidden:
            mp.delitem(sys.modules, k)
        yield modules
        for k in [k for k in sys.modules if k == "transformers_modules" or k.startswith("transformers_modules.")]:
            del sys.modules[k]
    if modules in sys.path:
        sys.path.remove(modules)
