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
    with pytest.raises(TableError, match="missing model, seed, test"):
        load_evals([tmp_path / "bad.json"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(TableError, match="no eval.json under"):
        load_evals([tmp_path / "empty"])
    with pytest.raises(TableError, match="no such file or directory"):
        load_evals([tmp_path / "absent"])
