"""The CPU-scale comparison (#14): the cell's models come from the family specs, every run gets the
same tokens, and `launcher/compare.py --preset quick` trains them all and writes the table, the seed
spread and the early-exit plot."""
import json

import pytest

from rgpt_dist.models.flavours import FLAVOURS
from rgpt_dist.studies.compare import SEEDS, cell_models, overrides, plan
from rgpt_dist.models.spec import families


def test_the_cell_is_every_family_in_table1_order():
    models = cell_models()
    assert models[0] == "gpt2-small" and len(models) == len([s for s in families().values() if s.paper_table1])
    assert models[-1] == "recurrentgpt-small-isoflops" and "ouro-small-isoflops" in models
    rows = [families()[FLAVOURS[m]["family"]].table1_row for m in models]
    assert rows == sorted(rows) and len(set(rows)) == len(rows)
    runs = plan()
    assert [r.name for r in runs[-len(SEEDS) + 1:]] == [f"recurrentgpt-small-isoflops-seed{s}" for s in SEEDS[1:]]


def test_every_run_sees_the_same_tokens(tmp_path):
    def shared(run):  # everything but the run's own directory and seed, and RRT's LoRA rank
        return [o for o in overrides(run, "cpu", "DATA", tmp_path)
                if not o.startswith(("log.run_dir", "train.seed", "model.lora_"))]
    runs = plan()
    assert all(shared(r) == shared(runs[0]) for r in runs)
    assert len({o for r in runs for o in overrides(r, "cpu", "DATA", tmp_path) if o.startswith("log.run_dir")}) == len(runs)
    rrt = next(r for r in runs if r.model == "rrt-small-isoflops")
    assert "model.lora_rank=5" in overrides(rrt, "cpu", "DATA", tmp_path)  # 64 / 768 of the width


@pytest.mark.slow
def test_quick_compare_trains_every_model_and_reports(dataset, tmp_path, capsys):
    from launcher.compare import main

    out, record = tmp_path / "compare", tmp_path / "record"
    args = ["--data", str(dataset), "--preset", "quick", "--nproc", "1", "--jobs", "2", "--record", str(record)]
    assert main([*args, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    trained = [line.split(":")[0] for line in said.splitlines() if ": done in " in line]
    assert sorted(trained) == sorted(r.name for r in plan()) and trained[-1] == "ouro-small-isoflops-seed1337"  # the dearest last
    assert sorted(p.name for p in record.iterdir()) == sorted(trained)
    # another machine (a fresh output directory) trains nothing and reports the same table
    assert main([*args, "--out", str(tmp_path / "again")]) == 0
    said = capsys.readouterr().out
    assert ": done in " not in said and said.count("not trained again") == len(trained)
    assert (tmp_path / "again" / "compare.md").read_text() == (out / "compare.md").read_text().replace(str(out), str(tmp_path / "again"))
    report = json.loads((out / "compare.json").read_text())
    assert [r["name"] for r in report["runs"]] == [r.name for r in plan()]
    assert all(r["status"] == "finished" and r["val_loss"] > 0 for r in report["runs"])
    assert all(r["early_exit"] for r in report["runs"] if r["family"] != "gpt2")
    assert set(report["seed_spread"]["runs"]) == {f"recurrentgpt-small-isoflops-seed{s}" for s in SEEDS}
    assert "Seed spread" in (out / "compare.md").read_text() and (out / "early_exit.png").stat().st_size > 0
    assert "| Ouro |" in said
    assert main(["--data", str(tmp_path), "--out", str(out)]) == 2  # not a dataset
    assert main([*args, "--out", str(out), "--jobs", "0"]) == 2


def test_the_long_preset_trains_every_model_at_both_seeds_on_ten_times_the_tokens(tmp_path):
    """Issue #29's study: every model at every seed, 10x the tokens of `cpu` at twice its width, with
    checkpoints along the way (a killed run resumes: the trainer's rules, tested in tests/train)."""
    from rgpt_dist.studies.launch import PRESETS

    runs = plan(every_seed=True)
    assert sorted((r.model, r.seed) for r in runs) == sorted((m, s) for m in cell_models() for s in SEEDS)
    tokens = {p: PRESETS[p]["max_steps"] * PRESETS[p]["global_batch_size"] * PRESETS[p]["seq_len"] for p in ("cpu", "long")}
    assert tokens["long"] == 10 * tokens["cpu"] and PRESETS["long"]["d_model"] == 128
    o = overrides(runs[0], "long", "DATA", tmp_path)
    assert "checkpoint.every_steps=50" in o and "eval.every_steps=100" in o and "train.max_steps=500" in o
    assert "parallel.dtype=bf16-autocast" in o and "parallel.dtype=fp32" in overrides(runs[0], "cpu", "DATA", tmp_path)


def test_the_ordering_is_the_mean_over_seeds_beside_the_papers():
    from rgpt_dist.studies.compare.report import model_summary, ordering_markdown

    def row(name, method, loss):
        return {"name": name, "method": method, "val_loss": loss}
    rows = [row("gpt2-small-seed1337", "GPT-2", 3.0), row("gpt2-small-seed42", "GPT-2", 3.2),
            row("mor-small-isoflops-seed1337", "MoR", 2.9), row("mor-small-isoflops-seed42", "MoR", 3.0),
            row("ouro-small-isoflops-seed1337", "Ouro", None)]
    models = model_summary(rows)
    assert [m["model"] for m in models] == ["mor-small-isoflops", "gpt2-small", "ouro-small-isoflops"]
    mor, gpt2 = models[0], models[1]
    assert mor["mean"] == pytest.approx(2.95) and mor["range"] == pytest.approx(0.1) and mor["rank"] == 1
    assert gpt2["sd"] == pytest.approx(0.1414213562) and models[2]["mean"] is None and models[2]["rank"] is None
    assert mor["paper_val_loss"] == 3.30 and (mor["paper_rank"], gpt2["paper_rank"], models[2]["paper_rank"]) == (3, 1, 2)
    text = ordering_markdown(models)
    assert "| 1 | MoR | `mor-small-isoflops` | 2 | 2.9500 | 0.0707 | 0.1000 | 3.30 | 3 |" in text


def test_only_picks_runs_by_pattern_and_refuses_one_that_matches_nothing(tmp_path):
    """`--only` lets a fresh machine start the dearest runs first; a typo trains nothing."""
    from launcher.compare import main
    from rgpt_dist.studies.base import chosen as _chosen

    runs = plan(every_seed=True)
    assert [r.name for r in _chosen(runs, "ouro-*")] == ["ouro-small-isoflops-seed1337", "ouro-small-isoflops-seed42"]
    assert [r.name for r in _chosen(runs, "gpt2-*-seed42, ouro-*42")] == ["gpt2-small-seed42", "ouro-small-isoflops-seed42"]
    assert _chosen(runs, None) == runs
    for bad in ("ouro-*,nope-*", " , "):
        with pytest.raises(ValueError, match="matches none"):
            _chosen(runs, bad)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    assert main(["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--only", "nope-*"]) == 2
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_only_trains_the_chosen_runs_and_reports_the_recorded_others(tmp_path, monkeypatch):
    """A fresh machine given `--only` restores every recorded run (the report covers them), trains
    only the chosen ones that are not recorded."""
    import launcher.compare as launcher
    from rgpt_dist.studies import records, runner
    from rgpt_dist.studies.compare import report as compare_report

    recorded = {"mor-small-isoflops-seed42", "ouro-small-isoflops-seed42"}  # as if committed by earlier machines
    for name in recorded:
        (tmp_path / "rec" / name).mkdir(parents=True)
        for f in ("config.yaml", "metrics.jsonl", "record.json"):
            (tmp_path / "rec" / name / f).write_text(f"{name}\n" if f == "config.yaml" else "{}\n")
    monkeypatch.setattr(records, "why_not", lambda d, cfg, data: None if d.name in recorded else "no record")
    trained = []
    monkeypatch.setattr(runner, "run_all", lambda todo, *a, **k: trained.extend(r.name for r in todo) or [])
    monkeypatch.setattr(compare_report, "report", lambda out, runs: {"md": _write(out / "compare.md", "")})
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    out = tmp_path / "out"
    assert launcher.main(["--data", str(tmp_path / "data"), "--out", str(out), "--preset", "long",
                          "--record", str(tmp_path / "rec"), "--only", "ouro-*,gpt2-*"]) == 0
    # chosen and not recorded, cheapest first
    assert trained == ["gpt2-small-seed1337", "gpt2-small-seed42", "ouro-small-isoflops-seed1337"]
    assert {p.name for p in out.iterdir() if p.is_dir()} == recorded  # restored, chosen or not: the report reads them
    assert (out / "mor-small-isoflops-seed42" / "config.yaml").read_text() == "mor-small-isoflops-seed42\n"


def _write(path, text):
    path.write_text(text)
    return path


def test_one_models_seed_spread_is_not_called_the_noise_when_every_model_has_its_own():
    from rgpt_dist.studies.compare.report import markdown

    spread = {"runs": {"recurrentgpt-small-isoflops-seed1337": 3.029, "recurrentgpt-small-isoflops-seed42": 3.0275},
              "mean": 3.02825, "range": 0.0015}
    assert "within run-to-run noise" in markdown([], spread)  # `make compare`: the only spread there is
    text = markdown([], spread, every_seeded=True)  # the long preset: each model's spread is in the ordering
    assert "within run-to-run noise" not in text and "Every model's own spread" in text and "0.0015" in text
