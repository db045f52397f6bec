"""make compare-rt (rgpt_dist/studies/rt_compare/__init__.py, rgpt_dist/studies/rt_compare/report.py): the dense model and
the RT with half its layers at equal non-embedding parameters on the same tokens, two seeds each; the
report's means, spreads and difference from fake runs with known losses."""
import json

import pytest

from rgpt_dist.config import load_config
from rgpt_dist.studies.rt_compare.report import report
from rgpt_dist.flops import param_count
from rgpt_dist.studies import rt_compare
from rgpt_dist.studies.launch import ROOT


def configs(tmp_path):
    return {run: load_config(ROOT / run.config, [*rt_compare.overrides(run, "cpu", str(tmp_path / "data"), tmp_path),
                                                 *run.overrides])
            for run in rt_compare.plan()}


def test_the_pair_is_matched_on_parameters_and_tokens(tmp_path):
    cfgs = configs(tmp_path)
    assert [(r.model, r.seed) for r in cfgs] == [("dense 4x64", 1337), ("RT 2x90", 1337), ("dense 4x64", 42),
                                                  ("RT 2x90", 42)]
    shapes = {(c.model.family, c.model.n_layer, c.model.d_model) for c in cfgs.values()}
    assert shapes == {("gpt2", 4, 64), ("rt", 2, 90)}
    dense, rt = (next(c.model for r, c in cfgs.items() if r.model == m) for m in rt_compare.MODELS)
    assert abs(param_count(rt, embeddings=False) / param_count(dense, embeddings=False) - 1) < 0.015
    recipe = {(c.train.max_steps, c.train.global_batch_size, c.train.seq_len, tuple(c.data.paths)) for c in cfgs.values()}
    assert len(recipe) == 1 and {c.train.seed for c in cfgs.values()} == {1337, 42}
    assert all((c.model.pos_encoding, c.model.norm, c.model.qk_norm) == ("alibi", "rmsnorm", True) for c in cfgs.values())
    assert {c.log.run_dir for c in cfgs.values()} == {str(tmp_path / r.name) for r in cfgs}


def test_the_report_gives_each_models_mean_spread_and_the_difference(tmp_path):
    losses = {"dense-4x64-seed1337": 5.0, "rt-2x90-seed1337": 4.8, "dense-4x64-seed42": 5.2, "rt-2x90-seed42": 4.9}
    for run, cfg in configs(tmp_path).items():
        (tmp_path / run.name).mkdir()
        (tmp_path / run.name / "config.yaml").write_text(cfg.to_yaml())
        steps = cfg.train.max_steps
        records = [{"step": s, "loss": 6.0 - s / steps} for s in range(1, steps + 1)]
        records.append({"step": steps, "val_loss": losses[run.name]})
        (tmp_path / run.name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    paths = report(tmp_path, rt_compare.plan())
    result = json.loads(paths["json"].read_text())
    dense, rt = result["models"]["dense 4x64"], result["models"]["RT 2x90"]
    assert dense["mean"] == pytest.approx(5.1) and dense["range"] == pytest.approx(0.2)
    assert rt["mean"] == pytest.approx(4.85) and rt["range"] == pytest.approx(0.1)
    assert result["rt_minus_dense"] == pytest.approx(-0.25)
    assert "RT minus dense (means): -0.2500" in paths["md"].read_text()
    assert paths["png"].stat().st_size > 0
