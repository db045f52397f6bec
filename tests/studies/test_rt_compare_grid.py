"""configs/experiments/rt-*.yaml and slurm/rt_grid.sh: the layerwise Recurrent Transformer against its
dense partners in its authors' recipe (rgpt_dist/studies/rt_compare/grid.py)."""
import re
from pathlib import Path

import pytest
import yaml

from rgpt_dist.config import load_config
from rgpt_dist.studies.rt_compare.grid import grid, names, slurm_script
from rgpt_dist.flops import param_count
from rgpt_dist.train.preflight import preflight

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "configs" / "experiments"
# the authors' settings (SPEC section 9): name -> (layers, width)
SETTINGS = {"150m-12l": (12, 1024), "150m-6l": (6, 1408), "300m-24l": (24, 1024), "300m-12l": (12, 1408),
            "300m-6l": (6, 2048)}


def test_rt_files_match_the_generator():
    files = {p.stem for p in EXPERIMENTS.glob("rt-*.yaml")}
    assert files == set(names()) == {f"rt-{s}" for s in SETTINGS} | {f"rt-dense-{s}" for s in SETTINGS}
    for name, data in grid().items():
        assert yaml.safe_load((EXPERIMENTS / f"{name}.yaml").read_text()) == data


@pytest.mark.parametrize("setting", SETTINGS)
def test_each_pair_runs_the_authors_recipe_at_matched_parameters(setting):
    rt, dense = (load_config(EXPERIMENTS / f"{n}.yaml") for n in (f"rt-{setting}", f"rt-dense-{setting}"))
    layers, width = SETTINGS[setting]
    for cfg, family in ((rt, "rt"), (dense, "gpt2")):
        t, m = cfg.train, cfg.model
        assert (m.family, m.n_layer, m.d_model, m.n_head) == (family, layers, width, width // 64)
        assert (t.seq_len, t.global_batch_size, t.tokens_per_step()) == (512, 512, 262144)
        assert t.max_steps == (12500 if setting.startswith("150m") else 25000)
        assert (t.lr, t.min_lr, t.warmup_steps, t.weight_decay, t.beta1, t.beta2, t.grad_clip) == (
            1e-3, 1e-4, 1250, 1e-5, 0.9, 0.95, 1.0)
        assert cfg.parallel.dtype == "bf16" and cfg.data.paths == ["data/c4"]
        for gpus in (8, 16):  # everything but the data, which a test machine has not prepared
            assert [p for p in preflight(cfg, gpus) if not p.startswith("data.paths[0]='data/c4'")] == []
    # an RT layer holds a Transformer block's parameters; only the untied head differs
    assert param_count(rt.model) - param_count(dense.model) == rt.model.padded_vocab_size * width


def test_the_rt_array_is_the_generators_and_names_every_config():
    text = (ROOT / "slurm" / "rt_grid.sh").read_text()
    assert text == slurm_script(), "slurm/rt_grid.sh is stale: regenerate it (rt_grid.slurm_script)"
    listed = re.search(r"^MODELS=\((.*?)\)$", text, re.M).group(1).split()
    assert listed == names() and all((EXPERIMENTS / f"{n}.yaml").is_file() for n in listed)
    assert re.search(r"^#SBATCH --array=0-(\d+)$", text, re.M).group(1) == str(len(listed) - 1)
    assert re.search(r"^BUDGETED=0 ", text, re.M)


def test_an_rt_array_task_trains_its_whole_config():
    """slurm/rt_grid.sh's task 2 under RGPT_DRY_RUN (slurm/common.sh prints the command it would run)."""
    from tests.slurm.test_scripts import dry_run

    done = dry_run(ROOT / "slurm" / "rt_grid.sh", 2)
    assert done.returncode == 0, done.stderr
    assert f"{ROOT}/configs/experiments/rt-150m-6l.yaml" in done.stdout
    assert f'log.run_dir=\\"{ROOT}/runs/rt-150m-6l\\" ' in done.stdout  # the path as JSON: literal
    done = dry_run(ROOT / "slurm" / "rt_grid.sh", len(names()))
    assert done.returncode == 2 and f"this cell has {len(names())} models" in done.stderr
