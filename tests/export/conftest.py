import pytest
import torch

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
        train(nproc, out[name], data, *overrides, log_samples=name == "zero0-trained")  # test_export's replay
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


@pytest.fixture(scope="session")
def tiny_hf_exports(tmp_path_factory):
    """ROOT/looped (ships code) and ROOT/dense (no code): Hugging Face exports of tiny models, each with its
    tokenizer, as rgpt-export writes them. Shared: copy one (shutil.copytree) before changing it."""
    from rgpt_dist.config import GPT2Config, RecurrentGPTConfig
    from rgpt_dist.export.hf_dense import write_hf_gpt2
    from rgpt_dist.export.hf_looped_writer import write_hf_looped
    from rgpt_dist.export.tokenizer_files import write_tokenizer
    from rgpt_dist.registry import build_model

    root = tmp_path_factory.mktemp("hf_exports")
    small = dict(vocab_size=300, block_size=32, d_model=32, n_head=4)
    looped_cfg = RecurrentGPTConfig(**small, n_pre=1, n_rec=1, n_coda=1, n_loops=2)
    dense_cfg = GPT2Config(**small, n_layer=2)
    write_hf_looped(build_model(looped_cfg, seed=0).state_dict(), looped_cfg, root / "looped")
    write_hf_gpt2(build_model(dense_cfg, seed=0).state_dict(), dense_cfg, root / "dense", dtype=torch.float32)
    for name in ("looped", "dense"):
        write_tokenizer(root / name, model_max_length=32)
    return root
