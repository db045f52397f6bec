"""rgpt-think's table (mean and sample SD over seeds, one heatmap per group) and its refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rgpt_dist.thinking.cli import main as think


def frontier(path, seed, acc, model="thinking-graph-debug", alpha=0.0):
    path.mkdir(parents=True)
    (path / "frontier.json").write_text(json.dumps({
        "task": "graph", "model": model, "seed": seed, "checkpoint_choice": "last", "difficulties": [2, 6],
        "steps": [1, 8], "n": 500, "train_range": [1, 5], "accuracy": acc, "supervision_alpha": alpha}))


def test_the_table_averages_seeds_cell_by_cell(tmp_path, capsys):
    frontier(tmp_path / "runs/a", 42, [[0.5, 1.0], [0.5, 0.9]])
    frontier(tmp_path / "runs/b", 43, [[0.6, 1.0], [0.5, 0.7]])
    frontier(tmp_path / "runs/c", 42, [[0.5, 0.5], [0.5, 0.5]], model="thinking-graph-debug-fixed")
    assert think(["table", str(tmp_path / "runs"), "--out", str(tmp_path / "t")]) == 0
    data = json.loads((tmp_path / "t/table.json").read_text())["groups"]
    ours = next(g for g in data if g["model"] == "thinking-graph-debug")
    assert ours["seeds"] == [42, 43] and np.allclose(ours["mean"], [[0.55, 1.0], [0.5, 0.8]])
    assert np.allclose(ours["sd"], [[np.std([0.5, 0.6], ddof=1), 0.0], [0.0, np.std([0.9, 0.7], ddof=1)]])
    fixed = next(g for g in data if g["model"] == "thinking-graph-debug-fixed")
    assert fixed["sd"] == [[None, None], [None, None]]          # one seed: no SD, never 0
    md = (tmp_path / "t/table.md").read_text()
    assert "| 6 (OOD) | 50.00 ± 0.00 | 80.00 ± 14.14 |" in md and "n/a" in md
    assert len(list((tmp_path / "t").glob("frontier_*.png"))) == 2
    assert ours["ood_cell_mean"] == {"mean": 0.8, "sd": pytest.approx(np.std([0.9, 0.7], ddof=1)), "cells": 1}
    assert ours["authors_ood_best"] == {"mean": None, "sd": None, "hops": [6, 8, 10, 12]}  # hops 8-12 not in the grid


def test_the_supervision_sweep_is_summarised_by_its_ood_accuracy(tmp_path, capsys):
    """Only the cells beyond training (6 hops) with steps >= hops (8) count: 90 and 70 at a = 0."""
    frontier(tmp_path / "a0-s42", 42, [[0.5, 1.0], [0.5, 0.9]])
    frontier(tmp_path / "a0-s43", 43, [[0.5, 1.0], [0.5, 0.7]])
    frontier(tmp_path / "a5", 42, [[0.5, 1.0], [0.5, 0.6]], model="thinking-graph supervision_alpha=0.5", alpha=0.5)
    assert think(["table", str(tmp_path), "--out", str(tmp_path / "t")]) == 0
    md = (tmp_path / "t/table.md").read_text()
    assert "| 0 | thinking-graph-debug | 2 | 80.00 ± 14.14 | n/a |" in md
    assert "| 0.5 | thinking-graph supervision_alpha=0.5 | 1 | 60.00 ± n/a | n/a |" in md


def test_a_seed_twice_or_a_broken_file_is_refused(tmp_path, capsys):
    frontier(tmp_path / "a", 42, [[0.5, 1.0], [0.5, 0.9]])
    frontier(tmp_path / "b", 42, [[0.5, 1.0], [0.5, 0.9]])
    assert think(["table", str(tmp_path), "--out", str(tmp_path / "t")]) == 2
    assert "appears twice" in capsys.readouterr().err
    (tmp_path / "b/frontier.json").write_text('{"task": "graph"}')
    assert think(["table", str(tmp_path / "b"), "--out", str(tmp_path / "t")]) == 2
    assert "not a frontier record" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["train", "parity", "--model", "thinking-graph", "--seed", "1"], "unknown thinking task 'parity'"),
    (["train", "graph", "--model", "thinking-logic", "--seed", "1"], "model.readout_k=1 differs"),
    (["train", "graph", "--model", "thinking-graph", "--seed", "1", "model.max_steps=4"], "model.train_steps_max=8"),
    (["train", "graph", "--model", "gpt2-debug", "--seed", "1"], "this pair needs a thinking model"),
    (["train", "graph", "--model", "thinking-graph", "--seed", "1", "data.task="], "trains on a thinking task"),
    (["train", "graph", "--model", "thinking-graph", "--seed", "1", "model.attn_init=xavier"],
     "model.attn_init='xavier' is not one of linear, mha"),
])
def test_train_refuses_bad_input_before_any_process(tmp_path, argv, message, capsys):
    assert think([*argv[:2], *argv[2:], "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv,message", [
    (["--n", "100000000"], "argument --n: '100000000' is out of range: at most 100,000"),
    (["--batch-size", "100000000"], "argument --batch-size: '100000000' is out of range: at most 1,000"),
    (["--n", "0"], "argument --n: '0' is not a positive integer"),
])
def test_frontier_counts_are_bounded_before_anything_runs(tmp_path, monkeypatch, capsys, argv, message):
    """frontier --n builds every example of a bucket before scoring it and --batch-size sets one forward's
    activations: 1e8 would ask for tens of GiB. Refused while parsing (exit 2, option, value and cap named)."""
    monkeypatch.setattr("rgpt_dist.thinking.cli.frontier_run", lambda *a, **k: pytest.fail("frontier ran"))
    assert think(["frontier", str(tmp_path / "run"), *argv, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()
