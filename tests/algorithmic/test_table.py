"""Three-seed aggregation (J.4, Eq. J.1): the sample SD (ddof = 1) against a hand computation, one
seed reported as n/a (never 0), the paper's layouts, strict JSON and the plot file."""
from __future__ import annotations

import json
import math

import pytest

from rgpt_dist.algorithmic.table import TableError, aggregate, fmt, load_evals, mean_sd, write_tables


def _eval(task, model, seed, scores, val=0.9, metric="final"):
    """An eval.json record: scores {length: fraction right} of the primary metric (token too)."""
    test = {str(n): {"final": v, "token": v, "sequence": v / 2, "final_total": 1024} for n, v in scores.items()}
    return {"task": task, "model": model, "seed": seed, "step": 100 * seed, "primary_metric": metric,
            "limit": None, "test": test, "validation": {"accuracy": val}}


def _write(tmp_path, records):
    paths = []
    for i, r in enumerate(records):
        d = tmp_path / "runs" / f"r{i}" / "eval"
        d.mkdir(parents=True)
        (d / "eval.json").write_text(json.dumps(r))
        paths.append(d / "eval.json")
    return paths


def test_mean_and_sample_sd_by_hand():
    mean, sd = mean_sd([50.0, 60.0, 70.0])
    # sqrt(((50-60)^2 + 0 + (70-60)^2) / (3 - 1)) = sqrt(100) = 10 (ddof = 0 would give 8.165)
    assert mean == 60.0 and sd == pytest.approx(10.0, rel=1e-15)
    mean, sd = mean_sd([0.85, 1.15, 0.55])
    assert mean == pytest.approx(0.85, rel=1e-15) and sd == pytest.approx(math.sqrt((0.09 + 0.09) / 2), rel=1e-12)
    assert mean_sd([42.0]) == (42.0, None)
    assert fmt(60.0, 10.0) == "60.00 ± 10.00" and fmt(42.0, None) == "42.00 ± n/a"


def test_groups_by_task_and_model_in_percent(tmp_path):
    evals = load_evals(_write(tmp_path, [
        _eval("parity", "gpt", 42, {32: 0.50, 256: 0.49}), _eval("parity", "gpt", 43, {32: 0.60, 256: 0.51}),
        _eval("parity", "gpt", 44, {32: 0.70, 256: 0.50}), _eval("parity", "big", 42, {32: 1.0, 256: 0.75}),
        _eval("addition", "gpt", 42, {9: 0.6}, metric="token")]))
    groups = {(g["task"], g["model"]): g for g in aggregate(evals)}
    gpt = groups["parity", "gpt"]
    assert gpt["seeds"] == [42, 43, 44] and gpt["lengths"] == [32, 256]
    assert gpt["metrics"]["final"][32]["mean"] == pytest.approx(60.0) and gpt["metrics"]["final"][32]["sd"] == pytest.approx(10.0)
    assert gpt["metrics"]["sequence"][32]["mean"] == pytest.approx(30.0)
    one = groups["parity", "big"]["metrics"]["final"][256]
    assert one["n"] == 1 and one["mean"] == 75.0 and one["sd"] is None
    assert groups["addition", "gpt"]["primary_metric"] == "token"
    assert gpt["train_lengths"] is None                   # eval.json files written before the field


def test_a_group_carries_the_training_range_its_runs_recorded(tmp_path):
    """data.task_train_max runs record their cut grid (evaluate_run's train_lengths); the plot shades it."""
    capped = [{**_eval("parity", "cap", s, {32: 0.9}), "train_lengths": [3, 16]} for s in (42, 43)]
    [group] = aggregate(load_evals(_write(tmp_path, capped)))
    assert group["train_lengths"] == [3, 16]


def test_tables_json_and_plot_are_written(tmp_path):
    _write(tmp_path, [
        _eval("parity", "gpt", 42, {32: 0.50, 256: 0.49}), _eval("parity", "gpt", 43, {32: 0.60, 256: 0.51}),
        _eval("parity", "gpt", 44, {32: 0.70, 256: 0.50}), _eval("s5_swaps", "gpt", 42, {32: 0.9, 512: 0.01})])
    evals = load_evals([tmp_path / "runs"])          # a directory: its eval.json files, recursively
    assert len(evals) == 4
    out = tmp_path / "out"
    out.mkdir()
    paths = write_tables(evals, out)
    md = paths["md"].read_text()
    assert "| Parity (256) | 50.00 ± 1.00 |" in md                        # Table 3 layout: the longest length
    assert "| gpt | 42, 43, 44 | 60.00 ± 10.00 | 50.00 ± 1.00 |" in md     # the full grid of the task
    assert "| S5, swaps (512) | 1.00 ± n/a (n=1) |" in md                  # one seed: no SD, never 0
    assert "| Parity | 90.00 ± 0.00 |" in md and "| S5, swaps | 90.00 ± n/a (n=1) |" in md   # validation
    assert "## S5, swaps: whole-sequence accuracy" in md and "| gpt | 42 | 45.00 ± n/a (n=1) |" in md
    data = json.loads(paths["json"].read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    s5 = next(g for g in data["groups"] if g["task"] == "s5_swaps")
    assert s5["metrics"]["final"]["512"]["sd"] is None
    png = paths["plot"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_a_seed_twice_and_bad_input_are_refused(tmp_path):
    files = _write(tmp_path, [_eval("parity", "gpt", 42, {32: 0.5}), _eval("parity", "gpt", 42, {32: 0.6})])
    with pytest.raises(TableError, match="seed 42 appears twice"):
        aggregate(load_evals(files))
    (tmp_path / "bad.json").write_text('{"task": "parity"}')
    with pytest.raises(TableError, match="bad.json: model is missing"):
        load_evals([tmp_path / "bad.json"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(TableError, match="no eval.json under"):
        load_evals([tmp_path / "empty"])
    with pytest.raises(TableError, match="no such file or directory"):
        load_evals([tmp_path / "absent"])


# ---- the paper's layouts (Tables 2 + 3, 7, 9): expected cells computed here -----------------------

def _expected(values):
    """'mean ± SD' of fractions, in percent, by statistics (n - 1 denominator); n/a for one value."""
    import statistics

    pct = [100 * v for v in values]
    sd = "n/a" if len(pct) == 1 else f"{statistics.stdev(pct):.2f}"
    text = f"{statistics.fmean(pct):.2f} ± {sd}"
    return text if len(pct) == 3 else f"{text} (n={len(pct)})"


def _paper_evals(models, tasks, choice, base, val=None, step=2000):
    """One record per (model, task, seed 42-44): test score base + 0.01 model index + 0.003 seed^2 at
    every length; the validation accuracy `val` (or 0.5 + the same offsets)."""
    records = []
    for i, model in enumerate(models):
        for task, lengths in tasks.items():
            for j, seed in enumerate((42, 43, 44)):
                score = base + 0.01 * i + 0.003 * j * j
                r = _eval(task, model, seed, {n: score for n in lengths},
                          val=(0.5 if val is None else val) + 0.01 * i + 0.003 * j * j,
                          metric="token" if task == "addition" else "final")
                records.append({**r, "checkpoint_choice": choice, "step": step - 100 * j})
    return records


def _score(base, i):
    return [base + 0.01 * i + 0.003 * j * j for j in range(3)]


def test_table9_layout_cells(tmp_path):
    models = ["rlt1-4+4", "rlt0-4+4", "rlt2-4+4", "rlt-transformer-8"]
    tasks = {"parity": [32, 64, 256], "s5_swaps": [32, 48], "mod5_flat": [63]}
    files = _write(tmp_path, _paper_evals(models, tasks, "best", 0.6)
                   + _paper_evals(models[:2], tasks, "last", 0.2))         # last checkpoints: not Table 9's
    out = tmp_path / "out"
    out.mkdir()
    paths = write_tables(load_evals(files), out, layouts=("table9",))
    md = paths["md"].read_text()
    assert "| Task / length | RLT-1 | RLT-0 | RLT-2 chunk4 | Transformer 8 |" in md
    for label in ("Parity / 64", "S5 swaps / 48", "Mod-5 flat / 63"):
        assert f"| {label} | " + " | ".join(_expected(_score(0.6, i)) for i in range(4)) + " |" in md
    assert "S5 standard" not in md and "Table 3 layout" not in md          # no such runs; only the layout named
    cell = json.loads(paths["json"].read_text())["layouts"]["table9"]["rows"][0][2]
    assert cell["values"] == pytest.approx([100 * v for v in _score(0.6, 1)], abs=1e-12)


def test_table2_layout_last_validation_then_longest_test(tmp_path):
    models = ["rlt1-4+4", "rlt1-5+3", "rlt1-6+2", "rlt1-7+1", "rlt1-8+0", "rlt-transformer-8"]
    tasks = {"parity": [32, 256], "addition": [9, 32]}
    records = (_paper_evals(models, tasks, "best", 0.3, val=0.8, step=1500)
               + _paper_evals(models[:5], tasks, "last", 0.1, val=0.4, step=2000))   # no last GPT 8 run
    out = tmp_path / "out"
    out.mkdir()
    md = write_tables(load_evals(_write(tmp_path, records)), out, layouts=("table2",))["md"].read_text()
    header = "| RLT-1 4+4 | RLT-1 5+3 | RLT-1 6+2 | RLT-1 7+1 | RLT-1 8+0 | GPT 8 |"
    assert f"| Task {header}" in md and f"| Task (test length) {header}" in md
    # validation of the last checkpoints (step 2,000 and its seeds' 1,900, 1,800), GPT 8 has none
    assert "| Parity | " + " | ".join(_expected(_score(0.4, i)) for i in range(5)) + " | - |" in md
    assert md.index("| Addition |") < md.index("| Parity |")              # the paper's row order
    # the best checkpoints' test accuracy at the longest length, every column
    assert "| Parity (256) | " + " | ".join(_expected(_score(0.3, i)) for i in range(6)) + " |" in md
    assert "| Addition (32) | " + " | ".join(_expected(_score(0.3, i)) for i in range(6)) + " |" in md
    assert "its steps: Addition 1800, 1900, 2000; Parity 1800, 1900, 2000." in md


def test_table7_layout_best_step_best_and_last(tmp_path):
    models = [f"rlt1-{e}+{16 - e}" for e in range(8, 17)] + ["rlt-transformer-16"]
    records = []
    for i, model in enumerate(models):
        best = _eval("parity", model, 42, {32: 1.0, 256: 0.5 + 0.05 * i})
        last = _eval("parity", model, 42, {32: 1.0, 256: 0.45 + 0.05 * i})
        records += [{**best, "step": 1000 + 100 * i, "checkpoint_choice": "best"},
                    {**last, "step": 2000, "checkpoint_choice": "last"}]
    out = tmp_path / "out"
    out.mkdir()
    md = write_tables(load_evals(_write(tmp_path, records)), out, layouts=("auto",))["md"].read_text()
    assert "| Model | Best step | Best checkpoint | Step 2000 |" in md
    assert f"| RLT-1 8+8 | 1000 | {_expected([0.5])} | {_expected([0.45])} |" in md
    assert f"| Transformer 16 | 1900 | {_expected([0.95])} | {_expected([0.9])} |" in md
    assert "Table 3 layout" in md                                           # auto: the generic layouts too
    assert "Table 9" not in md and "Table 2" not in md                      # auto: only layouts with data
    assert "rlt1-8+8 (last)" in md                                          # last groups labelled


def test_layout_models_override_and_refusals(tmp_path, capsys):
    from rgpt_dist.algorithmic.cli import main

    models = ["rlt1-debug", "rlt0-debug", "rlt2-debug", "rlt-transformer-debug"]
    files = _write(tmp_path, _paper_evals(models, {"parity": [32, 64]}, "best", 0.7))
    out = tmp_path / "out"
    assert main(["table", *map(str, files), "--out", str(out), "--layout", "table9", "--models", ",".join(models)]) == 0
    md = (out / "table.md").read_text()
    assert "| Task / length | RLT-1 (rlt1-debug) | RLT-0 (rlt0-debug) | RLT-2 chunk4 (rlt2-debug) |" in md
    assert "| Parity / 64 | " + " | ".join(_expected(_score(0.7, i)) for i in range(4)) + " |" in md
    capsys.readouterr()
    for extra, needle in ((["--layout", "table3"], "unknown layout 'table3'"),
                          (["--layout", "table9", "--models", "a,b"], "layout table9 has 4 models"),
                          (["--models", "a,b,c,d"], "name exactly one of table2, table7, table9"),
                          (["--layout", ","], "names nothing")):
        assert main(["table", str(tmp_path / "absent"), "--out", str(tmp_path / "o2"), *extra]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "o2").exists()                                    # refused before any work
