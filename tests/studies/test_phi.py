"""make phi's runs (rgpt_dist/studies/phi/__init__.py): the iso-depth rule at CPU scale, 9 (budget, r)
cells, each run's training FLOPs at its budget within the rounding of one step, and every run's config
valid with the overrides the study passes (launch-time validation would refuse it otherwise)."""
from pathlib import Path

from rgpt_dist.config import load_config
from rgpt_dist.flops import param_split, train_flops
from rgpt_dist.studies import phi
from rgpt_dist.studies.base import Context
from rgpt_dist.studies.launch import ROOT


def cells():
    """(r, width, budget) of each run, in the plan's order, computed here from the constants."""
    return [(r, d, c) for c in sorted(phi.BUDGETS, reverse=True) for d in phi.WIDTHS for r in phi.RECURRENCES]


def test_the_plan_is_27_iso_depth_runs_in_9_cells():
    runs = phi.plan()
    assert len(runs) == 27 and len({r.name for r in runs}) == 27
    assert {(c, r) for r, _, c in cells()} == {(c, r) for c in phi.BUDGETS for r in (1, 2, 4)}
    assert [r.name for r in runs] == [f"phi-cpu-r{r}-d{d}-c{c:.2g}" for r, d, c in cells()]  # cheap runs last


def test_every_run_is_valid_iso_depth_and_spends_its_budget(tmp_path):
    ctx = Context(out=Path(tmp_path / "runs"), data=str(tmp_path / "data"))
    for run, (r, d_model, budget) in zip(phi.plan(), cells()):
        cfg = load_config(ROOT / run.config, [*phi.PHI.overrides(run, ctx), *run.overrides])
        m, t = cfg.model, cfg.train
        assert (m.family, m.n_pre, m.n_coda, m.n_rec * m.n_loops, m.n_loops, m.depth_sampler) == (
            "recurrent_gpt", 1, 1, 4, r, "fixed")
        assert (m.d_model, m.d_model // m.n_head, t.seq_len, t.global_batch_size) == (d_model, 16, 128, 8)
        spent = train_flops(m, t.seq_len) * t.tokens_per_step() * t.max_steps
        assert abs(spent / budget - 1) <= 0.5 / t.max_steps + 1e-9  # rounded to a whole step
        assert t.max_steps >= 34 and cfg.eval.every_steps == t.max_steps == cfg.checkpoint.every_steps
        assert cfg.log.run_dir == str(tmp_path / "runs" / run.name) and cfg.data.paths == [str(tmp_path / "data")]
        n_once, n_rec = param_split(m)
        d = d_model  # prelude + coda + final LayerNorm once; 4 / r core blocks, W_proj and the gate each step
        assert (n_once, n_rec) == (2 * (12 * d * d + 13 * d) + 2 * d,
                                   (4 // r) * (12 * d * d + 13 * d) + 5 * d * d + 6 * d)
