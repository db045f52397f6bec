from pathlib import Path

import pytest
import yaml

from rgpt_dist.config import load_config
from rgpt_dist.config.experiments import grid, trained_flavours
from rgpt_dist.flops import param_count

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "configs" / "experiments"


def test_grid_files_match_the_generator():
    files = {p.stem for p in EXPERIMENTS.glob("*.yaml")} - {"quickstart", "debug"}
    assert files == set(grid()) and len(files) == 2 * len(trained_flavours())
    for name, data in grid().items():
        assert yaml.safe_load((EXPERIMENTS / f"{name}.yaml").read_text()) == data


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_experiment_config_loads_and_validates(path):
    cfg = load_config(path)
    if path.stem not in ("quickstart", "debug"):
        assert cfg.train.tokens_per_step() == 491520 and cfg.train.seq_len == 1024
        assert cfg.train.max_steps == (40000 if path.stem.endswith("40k") else 20000)
        assert (cfg.train.lr, cfg.train.min_lr, cfg.train.warmup_steps, cfg.train.weight_decay) == (6e-4, 6e-5, 2000, 0.1)
        assert (cfg.train.beta1, cfg.train.beta2, cfg.train.grad_clip, cfg.train.seed) == (0.9, 0.95, 1.0, 1337)
        assert cfg.parallel.dtype == "bf16"


def test_isoparams_cells_store_as_many_blocks_as_their_dense_model():
    for rec, dense in (("recurrentgpt-medium-isoparams-20k", "gpt2-medium-20k"),
                       ("recurrentgpt-large-isoparams-20k", "gpt2-large-20k")):
        r, d = load_config(EXPERIMENTS / f"{rec}.yaml").model, load_config(EXPERIMENTS / f"{dense}.yaml").model
        assert r.n_pre + r.n_rec + r.n_coda == d.n_layer
        assert abs(param_count(r) / param_count(d) - 1) < 0.02
