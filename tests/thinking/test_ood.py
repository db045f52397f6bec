"""The supervision sweep's two out-of-distribution statistics (rgpt_dist.thinking.ood) on hand-made
grids where they differ, every expected value worked out by hand below; and the table that reports
both under their own names."""
from __future__ import annotations

import json

import pytest

from rgpt_dist.thinking.cli import main as think
from rgpt_dist.thinking.ood import authors_ood_best, ood_cell_mean

HOPS = [4, 6, 8, 10, 12]
STEPS = [8, 12, 20]
SEED42 = [[1.0, 1.0, 1.0],     # 4 hops: in the training range (1-5), read by neither
          [1.0, 0.9, 0.8],     # 6: steps 8, 12, 20 all >= 6       -> cells 1.0 0.9 0.8, best 1.0
          [0.5, 1.0, 0.6],     # 8: steps 8, 12, 20 all >= 8       -> cells 0.5 1.0 0.6, best 1.0
          [0.5, 0.5, 0.7],     # 10: steps 12, 20 (8 < 10 is not)  -> cells 0.5 0.7,     best 0.7
          [0.5, 0.5, 0.5]]     # 12: steps 12, 20                  -> cells 0.5 0.5,     best 0.5
SEED43 = [[1.0, 1.0, 1.0],
          [1.0, 1.0, 1.0],     # 6:  cells 1.0 1.0 1.0, best 1.0
          [0.5, 1.0, 1.0],     # 8:  cells 0.5 1.0 1.0, best 1.0
          [0.5, 0.5, 0.9],     # 10: cells 0.5 0.9,     best 0.9
          [0.5, 0.5, 0.6]]     # 12: cells 0.5 0.6,     best 0.6
SUPERVISED = [[1.0, 1.0, 1.0],
              [1.0, 1.0, 1.0],  # 6:  cells 1.0 1.0 1.0, best 1.0
              [0.5, 0.5, 0.5],  # 8:  cells 0.5 x 3,     best 0.5
              [0.5, 0.5, 0.5],  # 10: cells 0.5 x 2,     best 0.5
              [0.5, 0.5, 0.5]]  # 12: cells 0.5 x 2,     best 0.5


@pytest.mark.parametrize("grid,ours,theirs", [
    # ours: the 10 cells' mean; theirs: the 4 bests' mean
    (SEED42, (1.0 + 0.9 + 0.8 + 0.5 + 1.0 + 0.6 + 0.5 + 0.7 + 0.5 + 0.5) / 10, (1.0 + 1.0 + 0.7 + 0.5) / 4),  # 0.70, 0.80
    (SEED43, (1.0 + 1.0 + 1.0 + 0.5 + 1.0 + 1.0 + 0.5 + 0.9 + 0.5 + 0.6) / 10, (1.0 + 1.0 + 0.9 + 0.6) / 4),  # 0.80, 0.875
    (SUPERVISED, (3 * 1.0 + 7 * 0.5) / 10, (1.0 + 3 * 0.5) / 4),                                               # 0.65, 0.625
])
def test_the_two_statistics_on_a_hand_made_grid(grid, ours, theirs):
    assert ood_cell_mean(grid, HOPS, STEPS, train_max=5) == pytest.approx(ours, abs=1e-12)
    assert authors_ood_best(grid, HOPS, STEPS, "graph") == pytest.approx(theirs, abs=1e-12)
    assert ood_cell_mean(grid, HOPS, STEPS, train_max=5) != pytest.approx(theirs)  # they differ on each grid


def test_the_authors_statistic_reproduces_their_recorded_number():
    """hhchen1105/Depth-Recurrent-Transformer graph/sweep_results/e3_a0_d256_s46.json: its grid (hops
    x steps below, their test grid) and the `ood_acc` it records, 0.8705 = (1 + 1 + 0.982 + 0.5) / 4.
    Ours on the same grid: its 14 cells 1 1 1 1 | 0.518 1 1 1 | 0.5 0.738 0.982 | 0.5 0.5 0.5 -> 11.238 / 14."""
    hops, steps = [1, 2, 3, 4, 6, 8, 10, 12], [1, 2, 3, 5, 8, 12, 15, 20]
    grid = [[1.0] * 8, [0.5] + [1.0] * 7, [0.5] * 2 + [1.0] * 6, [0.5] * 3 + [1.0] * 5, [0.5] * 4 + [1.0] * 4,
            [0.5] * 4 + [0.518, 1.0, 1.0, 1.0], [0.5] * 6 + [0.738, 0.982], [0.5] * 8]
    assert authors_ood_best(grid, hops, steps, "graph") == pytest.approx(0.8705, abs=1e-12)
    assert ood_cell_mean(grid, hops, steps, train_max=5) == pytest.approx(11.238 / 14, abs=1e-12)


def test_the_authors_statistic_is_undefined_off_their_grid():
    assert authors_ood_best(SEED42, HOPS, STEPS, "logic") is None                       # their sweep: graph only
    assert authors_ood_best(SEED42[:-1], HOPS[:-1], STEPS, "graph") is None             # no 12-hop row
    assert authors_ood_best([r[:1] for r in SEED42], HOPS, [8], "graph") is None        # no step >= 10
    assert ood_cell_mean(SEED42, HOPS, STEPS, train_max=12) is None                     # nothing beyond training


def write(path, seed, acc, alpha):
    path.mkdir(parents=True)
    (path / "frontier.json").write_text(json.dumps({
        "task": "graph", "model": "thinking-graph" + (f" supervision_alpha={alpha}" if alpha else ""), "seed": seed,
        "checkpoint_choice": "last", "difficulties": HOPS, "steps": STEPS, "n": 500, "train_range": [1, 5],
        "accuracy": acc, "supervision_alpha": alpha}))


def test_the_table_reports_both_under_their_names(tmp_path, capsys):
    """a = 0 over seeds 42, 43: ours 0.70, 0.80 -> 75.00 ± 7.07 (sample SD 0.1 / sqrt 2); theirs 0.80,
    0.875 -> 83.75 ± 5.30 (0.075 / sqrt 2). a = 0.5, one seed: 65.00 and 62.50, SD n/a."""
    write(tmp_path / "a0-s42", 42, SEED42, 0.0)
    write(tmp_path / "a0-s43", 43, SEED43, 0.0)
    write(tmp_path / "a5-s42", 42, SUPERVISED, 0.5)
    assert think(["table", str(tmp_path), "--out", str(tmp_path / "t")]) == 0
    md = (tmp_path / "t/table.md").read_text()
    assert ("| a | model | seeds | ours: mean over OOD cells, steps >= difficulty | "
            "authors': mean over hops (6, 8, 10, 12) of the best at steps >= hops |") in md
    assert "| 0 | thinking-graph | 2 | 75.00 ± 7.07 | 83.75 ± 5.30 |" in md
    assert "| 0.5 | thinking-graph supervision_alpha=0.5 | 1 | 65.00 ± n/a | 62.50 ± n/a |" in md
    groups = {g["supervision_alpha"]: g for g in json.loads((tmp_path / "t/table.json").read_text())["groups"]}
    assert groups[0.0]["ood_cell_mean"]["mean"] == pytest.approx(0.75, abs=1e-12)
    assert groups[0.0]["ood_cell_mean"]["cells"] == 10
    assert groups[0.0]["authors_ood_best"]["mean"] == pytest.approx(0.8375, abs=1e-12)
    assert groups[0.0]["authors_ood_best"]["hops"] == [6, 8, 10, 12]
