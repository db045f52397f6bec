"""`make ablation` (rgpt_dist/studies/ablation.py, launcher/ablation.py): Fig. 5's rows at CPU scale
from their configs, the same tokens for every row, and the report from the runs' records. The
training path is the study runner's (run_all), smoke-tested in test_compare.py; here the plan,
the overrides and the report on hand-written runs."""
from rgpt_dist.config import load_config
from rgpt_dist.studies.ablation.report import report
from rgpt_dist.studies.ablation import SPREAD_SEED, overrides, plan
from tests.eval.test_grid import make_run, train_records


def test_plan_is_fig5s_rows_with_a_second_seed_of_the_full_model(tmp_path):
    runs = plan()
    assert [r.name for r in runs] == [
        "gpt2-small-20k", "ablation-fig5-2-recurrence", "ablation-fig5-3-prelude-coda", "ablation-fig5-4-state-noise",
        "ablation-fig5-4b-noise-at-init", "ablation-fig5-5-reinjection", "recurrentgpt-small-isoflops-20k",
        f"ablation-b1-seed{SPREAD_SEED}-recurrentgpt"]
    shared = None
    for run in runs:
        args = overrides(run, "cpu", "DATA", tmp_path)
        cfg = load_config(run.config, args)
        assert cfg.model.d_model == 64 and cfg.log.run_dir == str(tmp_path / run.name)
        assert cfg.train.seed == (SPREAD_SEED if run is runs[-1] else 1337)
        same = (cfg.train.max_steps, cfg.train.global_batch_size, cfg.train.seq_len, cfg.data.paths)
        assert shared in (None, same)  # the same tokens for every row
        shared = same
    alone = load_config(runs[1].config, overrides(runs[1], "cpu", "DATA", tmp_path)).model
    assert (alone.n_pre, alone.n_coda, alone.injection, alone.gate, alone.sigma_x) == (0, 0, "none", "none", 0.0)


def test_report_writes_the_table_and_the_bar_chart(tmp_path):
    for i, run in enumerate(plan()):
        flavour = "gpt2-debug" if run.name.startswith("gpt2") else "recurrentgpt-debug"
        make_run(tmp_path, run.name, flavour, train_records(100) + [{"step": 100, "val_loss": 4.0 - i / 100}])
    paths = report(tmp_path)
    text = paths["md"].read_text()
    assert "## Fig. 5" in text and "| 6-gate | `recurrentgpt-small-isoflops-20k` |" in text
    assert "| recurrentgpt | seed1337, seed42 |" in text and paths["png"].stat().st_size > 1000
