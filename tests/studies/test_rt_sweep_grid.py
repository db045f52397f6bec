"""The authors' RT sweep as an option of slurm/rt_grid.sh (issue #42; rgpt_dist/studies/rt_compare/grid.py):
configs/experiments/rt-sweep/ is the generator's, each point is its grid run's config with their sweep's
lr x beta2, weight decay 0 and warm-up (sweep_recurrent_150m_512.yaml, sweep_recurrent_512.yaml:
5,000 steps of 12,500 at 150M, 10,000 of 25,000 at 300M), and RT_SWEEP=1 runs them."""
import re
from pathlib import Path

import pytest
import yaml

from rgpt_dist.config import load_config
from rgpt_dist.studies.rt_compare.grid import grid, names, sweep, sweep_points

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "configs" / "experiments" / "rt-sweep"
SCRIPT = ROOT / "slurm" / "rt_grid.sh"


def test_sweep_files_match_the_generator():
    assert {p.stem for p in SWEEP.glob("*.yaml")} == set(sweep()) == set(sweep_points())
    assert len(sweep()) == 6 * len(names()) == 60
    for name, data in sweep().items():
        assert yaml.safe_load((SWEEP / f"{name}.yaml").read_text()) == data


@pytest.mark.parametrize("run", names())
def test_each_point_is_its_grid_run_at_their_sweeps_settings(run):
    """Their 6 points (lr {1e-3, 3.16e-3, 1e-2} x beta2 {0.95, 0.99}), weight decay 0, their warm-up,
    cosine to 0.1 x lr; everything else (model, steps, batch, beta1, clip, data) the grid run's."""
    base = load_config(ROOT / "configs" / "experiments" / f"{run}.yaml")
    points = {name: p for name, p in sweep_points().items() if p[0] == run}
    assert sorted((lr, b2) for _, lr, b2 in points.values()) == [
        (1e-3, 0.95), (1e-3, 0.99), (3.16e-3, 0.95), (3.16e-3, 0.99), (1e-2, 0.95), (1e-2, 0.99)]
    for name, (_, lr, beta2) in points.items():
        cfg = load_config(SWEEP / f"{name}.yaml")
        t = cfg.train
        assert (t.lr, t.beta2, t.weight_decay, t.min_lr) == (lr, beta2, 0.0, pytest.approx(lr / 10, rel=1e-12))
        assert (t.warmup_steps, t.max_steps) == ((5000, 12500) if "-150m-" in run else (10000, 25000))
        assert cfg.model == base.model and cfg.data == base.data and cfg.parallel == base.parallel
        assert (t.seq_len, t.global_batch_size, t.beta1, t.grad_clip) == (512, 512, 0.9, 1.0)
        assert cfg.log.run_dir == f"runs/{name}" and grid()[run]["train"]["lr"] == 1e-3


def test_rt_sweep_1_runs_the_sweep_and_other_values_are_refused():
    """RT_SWEEP=1 (slurm/common.sh under RGPT_DRY_RUN): task 6 r + 2 i + j is grid run r at the i-th lr and
    the j-th beta2, its config in rt-sweep/ and its own run directory; 60 tasks; RT_SWEEP=2 exits 2."""
    from tests.slurm.test_scripts import dry_run

    text = SCRIPT.read_text()
    listed = re.search(r"^ {7}MODELS=\(\n(.*?)\)$", text, re.M | re.S).group(1).split()
    assert listed == list(sweep_points())
    done = dry_run(SCRIPT, 6 * 1 + 2 * 1 + 1, RT_SWEEP="1")   # run 1 (rt-dense-150m-12l), lr 3.16e-3, beta2 0.99
    assert done.returncode == 0, done.stderr
    assert f"{ROOT}/configs/experiments/rt-sweep/rt-dense-150m-12l-lr3.16e-3-b0.99.yaml" in done.stdout
    assert f'log.run_dir=\\"{ROOT}/runs/rt-dense-150m-12l-lr3.16e-3-b0.99\\" ' in done.stdout
    done = dry_run(SCRIPT, 60, RT_SWEEP="1")
    assert done.returncode == 2 and "this cell has 60 models" in done.stderr
    done = dry_run(SCRIPT, 0, RT_SWEEP="2")
    assert done.returncode == 2 and "RT_SWEEP=2 must be 0 (the grid) or 1 (the authors' sweep)" in done.stderr
    done = dry_run(SCRIPT, 2, RT_SWEEP="0")   # the grid, as without RT_SWEEP
    assert done.returncode == 0 and f"{ROOT}/configs/experiments/rt-150m-6l.yaml" in done.stdout
    assert "RT_SWEEP=1 sbatch --array=0-59 slurm/rt_grid.sh" in text
