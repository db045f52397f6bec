"""The CPU-scale comparison (#14): the cell's models come from the family specs, every run gets the
same tokens, and `launcher/compare.py --preset quick` trains them all and writes the table, the seed
spread and the early-exit plot."""
import json

import pytest

from rgpt_dist.config.flavours import FLAVOURS
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
    rrt = next(r for r in runs if r.flavour == "rrt-small-isoflops")
    assert "model.lora_rank=5" in overrides(rrt, "cpu", "DATA", tmp_path)  # 64 / 768 of the width


@pytest.mark.slow
def test_quick_compare_trains_every_model_and_reports(dataset, tmp_path, capsys):
    from launcher.compare import main

    out = tmp_path / "compare"
    assert main(["--data", str(dataset), "--out", str(out), "--preset", "quick", "--nproc", "1"]) == 0
    report = json.loads((out / "compare.json").read_text())
    assert [r["name"] for r in report["runs"]] == [r.name for r in plan()]
    assert all(r["status"] == "finished" and r["val_loss"] > 0 for r in report["runs"])
    assert all(r["early_exit"] for r in report["runs"] if r["family"] != "gpt2")
    assert set(report["seed_spread"]["runs"]) == {f"recurrentgpt-small-isoflops-seed{s}" for s in SEEDS}
    assert "Seed spread" in (out / "compare.md").read_text() and (out / "early_exit.png").stat().st_size > 0
    assert "| Ouro |" in capsys.readouterr().out
    assert main(["--data", str(tmp_path), "--out", str(out)]) == 2  # not a dataset
