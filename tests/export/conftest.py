import pytest

from tests.helpers.hf import isolated_hf
from tests.helpers.runs import BASE, train


@pytest.fixture(scope="module")
def hf_env(tmp_path_factory):
    """Offline, with transformers' remote-code copies in a temporary directory."""
    with isolated_hf(tmp_path_factory.mktemp("hf_home")) as home:
        yield home


# lr so small that AdamW moves a weight by at most ~1e-30 (a zero bias becomes +-1e-30, a 0.02 weight
# cannot change at all): the checkpoint must hold the seeded init up to that
FROZEN = ["train.lr=1e-30", "train.min_lr=0", "train.max_steps=2", "checkpoint.every_steps=2", "eval.every_steps=0"]
TRAINED = ["train.max_steps=4", "checkpoint.every_steps=4", "eval.every_steps=0"]


@pytest.fixture(scope="session")
def runs(tmp_path_factory, dataset):
    """name -> run directory of a finished short run (shared by the export, remote-code and
    untrusted-checkpoint tests; copy a run before changing it)."""
    root = tmp_path_factory.mktemp("export")
    data = dataset  # the session's (tests/conftest.py)
    layouts = {
        "zero3": (2, ["parallel.zero_stage=3", *FROZEN]),
        "tp2-bf16": (2, ["parallel.tp_size=2", "model.pad_vocab_multiple=256", "parallel.zero_stage=2",
                         "parallel.dtype=bf16", *FROZEN]),
        "zero2-trained": (2, ["parallel.zero_stage=2", *TRAINED]),
        "zero0-trained": (1, ["parallel.zero_stage=0", *TRAINED]),
        "bf16-trained": (1, ["parallel.zero_stage=2", "parallel.dtype=bf16", *TRAINED]),
    }
    out = {}
    for name, (nproc, overrides) in layouts.items():
        out[name] = root / name
        train(nproc, out[name], data, *overrides)
    # the quickstart's RecurrentGPT fields (n_loops) do not fit GPT-2: start from a dense grid config
    out["dense"] = root / "dense"
    train(1, out["dense"], data, "model=gpt2-debug", "parallel.zero_stage=1", *TRAINED, common=BASE,
          config="configs/experiments/gpt2-small-20k.yaml")
    # the competitors: Poisson sharded by tp = 2, RRT (its LoRA adapters) by ZeRO-3
    out["poisson-tp2"], out["rrt-zero3"] = root / "poisson-tp2", root / "rrt-zero3"
    train(2, out["poisson-tp2"], data, "model=poisson-debug", "model.n_loops=3", "model.k_max=2",
          "parallel.tp_size=2", "model.pad_vocab_multiple=256", "parallel.zero_stage=2", *TRAINED, common=BASE)
    train(2, out["rrt-zero3"], data, "model=rrt-debug", "model.n_loops=3", "parallel.zero_stage=3", *TRAINED,
          common=BASE)
    return out
