from pathlib import Path

import pytest
import yaml

from rgpt_dist.config import load_config
from rgpt_dist.config.experiments import grid, trained_flavours
from rgpt_dist.flops import param_count
from rgpt_dist.train.preflight import preflight

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "configs" / "experiments"


def test_grid_files_match_the_generator():
    files = {p.stem for p in EXPERIMENTS.glob("*.yaml") if not p.stem.startswith(("ablation-", "phi-"))} - {"quickstart", "debug"}
    assert files == set(grid()) and len(files) == 2 * len(trained_flavours())
    for name, data in grid().items():
        assert yaml.safe_load((EXPERIMENTS / f"{name}.yaml").read_text()) == data


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_experiment_config_loads_and_validates(path):
    cfg = load_config(path)
    if path.stem not in ("quickstart", "debug"):
        assert cfg.train.tokens_per_step() == 491520 and cfg.train.seq_len == 1024
        steps = cfg.train.max_steps
        if not path.stem.startswith(("ablation-", "phi-")):  # phi-*: tests/config/test_phi_sweep.py
            assert steps == (40000 if path.stem.endswith("40k") else 20000)
        assert (cfg.train.lr, cfg.train.min_lr, cfg.train.warmup_steps, cfg.train.weight_decay) == (6e-4, 6e-5, min(2000, steps // 10), 0.1)
        assert (cfg.train.beta1, cfg.train.beta2, cfg.train.grad_clip) == (0.9, 0.95, 1.0)
        assert cfg.train.seed == (int(path.stem.split("seed")[1].split("-")[0]) if "-seed" in path.stem else 1337)
        assert cfg.parallel.dtype == "bf16"
        for gpus in (8, 16):  # everything but the data, which a test machine has not prepared
            assert [p for p in preflight(cfg, gpus) if not p.startswith("data.paths[0]='data/pretrain'")] == []


def test_ablation_files_match_the_generator_and_each_row_adds_one_component():
    from rgpt_dist.config.ablations import REUSED, ablations

    files = {p.stem for p in EXPERIMENTS.glob("ablation-*.yaml")}
    assert files == set(ablations()) and not files & set(REUSED)
    for name, data in ablations().items():
        assert yaml.safe_load((EXPERIMENTS / f"{name}.yaml").read_text()) == data
    rows = {n.removeprefix("ablation-table7-"): load_config(EXPERIMENTS / f"{n}.yaml").model
            for n in files if n.startswith("ablation-table7-") and "dense" not in n}
    switches = lambda m: (m.n_pre, m.n_coda, m.sigma_x > 0, m.injection, m.gate)  # noqa: E731
    assert [switches(rows[k]) for k in ("2-recurrence", "3-prelude-coda", "4-state-noise", "5-reinjection", "6-gate")] == [
        (0, 0, False, "none", "none"), (2, 2, False, "none", "none"), (2, 2, True, "none", "none"),
        (2, 2, True, "concat", "none"), (2, 2, True, "concat", "learned")]
    assert rows["4b-noise-at-init"].state_noise == "init" and rows["2-recurrence"].n_rec * rows["2-recurrence"].n_loops == 24


def test_isoparams_cells_store_as_many_blocks_as_their_dense_model():
    for rec, dense in (("recurrentgpt-medium-isoparams-20k", "gpt2-medium-20k"),
                       ("recurrentgpt-large-isoparams-20k", "gpt2-large-20k")):
        r, d = load_config(EXPERIMENTS / f"{rec}.yaml").model, load_config(EXPERIMENTS / f"{dense}.yaml").model
        assert r.n_pre + r.n_rec + r.n_coda == d.n_layer
        assert abs(param_count(r) / param_count(d) - 1) < 0.02
