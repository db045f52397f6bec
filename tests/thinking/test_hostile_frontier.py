"""frontier.json from another user's run, read by `rgpt think table`: through the bounded reader and
a typed schema (rgpt_dist.thinking.frontier.read_frontier), so no field can inject a heading or a row
into table.md, break a cell, or declare a grid that exhausts memory."""
import json

import pytest

from rgpt_dist.thinking.frontier import FrontierError, load_frontiers, write_table


def _record(**changes):
    record = {"task": "graph", "model": "thinking-graph-debug", "seed": 42, "step": 10, "checkpoint_choice": "last",
              "difficulties": [1, 2], "steps": [1, 2, 4], "n": 10, "train_range": [1, 1],
              "supervision_alpha": 0.0, "accuracy": [[0.5, 0.6, 0.7], [0.4, 0.5, 1.0]]}
    return {**record, **changes}


@pytest.mark.parametrize("changes,message", [
    ({"model": "m | 99.9 |\n## Injected"}, "model = .* is not a valid value"),
    ({"task": "graph\n# x"}, "task = .* is not one of"),
    ({"accuracy": [[0.5, 0.6, 0.7], [0.4, 0.5]]}, "accuracy must be a list of 2 rows of 3 fractions"),
    ({"accuracy": [[0.5, 0.6, 0.7], [0.4, 0.5, "1"]]}, "accuracy must be a list of 2 rows of 3 fractions"),
    ({"accuracy": [[0.5, 0.6, 0.7], [0.4, 0.5, 1e308]]}, "accuracy must be a list of 2 rows of 3 fractions"),
    ({"difficulties": list(range(100_000))}, "difficulties must be a list of integers"),
    ({"steps": ["1", 2, 4]}, "steps must be a list of integers"),
    ({"n": 0}, "n = 0 is outside 1.."),
    ({"supervision_alpha": "0.5"}, "supervision_alpha must be a number"),
])
def test_a_hostile_frontier_json_never_reaches_the_table(tmp_path, changes, message):
    path = tmp_path / "frontier.json"
    path.write_text(json.dumps(_record(**changes)))
    with pytest.raises(FrontierError, match=message):
        load_frontiers([path])


def test_a_clean_record_makes_a_table_with_only_its_checked_fields(tmp_path):
    for seed in (42, 43):
        (tmp_path / f"s{seed}").mkdir()
        (tmp_path / f"s{seed}" / "frontier.json").write_text(json.dumps(_record(seed=seed, extra="| not kept |")))
    results = load_frontiers([tmp_path])
    assert all("extra" not in r for r in results)
    (tmp_path / "out").mkdir()
    table = write_table(results, tmp_path / "out")["md"].read_text()
    assert "thinking-graph-debug" in table and "not kept" not in table
