"""A run directory from another user, read by `rgpt algo eval` / `rgpt think frontier` and the
tables: every file through the bounded reader (rgpt_dist.run_files) and a typed schema, refused with
the file and the field named, never followed outside the run, never blocking."""
import json
import os

import pytest

from rgpt_dist.algorithmic import evaluate
from rgpt_dist.algorithmic.evaluate import (RUN_RECORD, EvalError, SelectionError, checkpoint_dir, model_label,
                                            run_config, select_checkpoint)
from rgpt_dist.algorithmic.table import TableError, load_evals
from rgpt_dist.checkpoints.record import RECORD, checksums
from tests.helpers.fifo import no_block
from tests.test_run_files import BOMB


def _complete_checkpoint(tag_dir):
    tag_dir.mkdir(parents=True)
    (tag_dir / "weights.pt").write_bytes(b"w")
    (tag_dir / RECORD).write_text(json.dumps(checksums(tag_dir)))
    return tag_dir


def _run(tmp_path, config="model: {family: rlt}\n"):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(config)
    return run


def test_best_json_naming_a_checkpoint_outside_the_run_is_refused(tmp_path):
    run = _run(tmp_path)
    _complete_checkpoint(tmp_path / "private" / "step_00000005")
    (run / "checkpoints" / "best.json").write_text(
        json.dumps({"tag": "../../private/step_00000005", "step": 5, "val_loss": 0.1}))
    with pytest.raises(SelectionError, match=r"best.json: tag = '../../private/step_00000005' is not a valid value"):
        select_checkpoint(run)
    (run / "checkpoints" / "best.json").write_text(json.dumps({"tag": "step_00000004", "step": 5, "val_loss": 0.1}))
    with pytest.raises(SelectionError, match="is not the tag of step 5"):
        select_checkpoint(run)


def test_a_fifo_at_best_json_does_not_block_the_evaluation(tmp_path):
    run = _run(tmp_path)
    os.mkfifo(run / "checkpoints" / "best.json")
    with pytest.raises(SelectionError, match="FIFO"):
        no_block(lambda: select_checkpoint(run), run / "checkpoints" / "best.json")


def test_a_config_alias_bomb_and_malformed_sections_are_refused(tmp_path):
    with pytest.raises(EvalError, match="config.yaml is not valid YAML"):
        run_config(_run(tmp_path, BOMB))
    with pytest.raises(EvalError, match=r"config.yaml: model must be a mapping, not list"):
        run_config(_run(tmp_path / "b", "model: [1, 2]\n"))


def test_a_malformed_run_record_names_the_file_and_the_field(tmp_path):
    run = _run(tmp_path)
    (run / RUN_RECORD).write_text("[1, 2]")
    with pytest.raises(EvalError, match="algo_run.json must hold a mapping, not list"):
        model_label(run, {})
    (run / RUN_RECORD).write_text(json.dumps({"task": "parity", "model": "rlt-debug", "seed": 1,
                                              "overrides": "model.n_enc=3"}))
    with pytest.raises(EvalError, match="algo_run.json: overrides must be a list of strings"):
        model_label(run, {})
    (run / RUN_RECORD).write_text(json.dumps({"task": "parity", "model": "x|y\n## injected", "seed": 1}))
    with pytest.raises(EvalError, match="algo_run.json: model = .* is not a valid value"):
        model_label(run, {})


def test_another_users_run_may_not_point_its_checkpoints_elsewhere(tmp_path, monkeypatch):
    run = _run(tmp_path)
    config = {"checkpoint": {"dir": str(tmp_path / "private")}}
    assert checkpoint_dir(run, config) == tmp_path / "private"      # one's own run: as configured
    assert checkpoint_dir(run, {"checkpoint": {"dir": str(run / "ck")}}) == run / "ck"
    monkeypatch.setattr(evaluate.os, "getuid", lambda: os.stat(run).st_uid + 1)  # the run is another user's
    with pytest.raises(EvalError, match="checkpoint.dir=.* lies outside the run directory of another user"):
        checkpoint_dir(run, config)
    assert checkpoint_dir(run, {"checkpoint": {"dir": str(run / "ck")}}) == run / "ck"  # inside: fine
    with pytest.raises(EvalError, match="checkpoint.dir must be a path, not list"):
        checkpoint_dir(run, {"checkpoint": {"dir": ["x"]}})


def _eval(**changes):
    record = {"task": "parity", "model": "rlt-debug", "seed": 42, "primary_metric": "final",
              "test": {"64": {"final": 0.5}}, "validation": {"accuracy": 0.9}}
    return {**record, **changes}


@pytest.mark.parametrize("changes,message", [
    ({"model": "gpt | 99.9\n## Injected heading"}, "model = .* is not a valid value"),
    ({"task": "parity\n| x |"}, "task = .* is not one of"),
    ({"test": {"64": {"final": "0.5"}}}, "test.64.final must be a number, not str"),
    ({"test": {"64": {"final": 1e308}}}, r"test.64.final = 1e\+308 is not a finite number in \[0.0, 1.0\]"),
    ({"test": {"sixty-four": {"final": 0.5}}}, "test.sixty-four is not a test length"),
    ({"validation": {"accuracy": -1}}, "validation.accuracy = -1 is not a finite number"),
    ({"limit": "256\n# x"}, "limit must be an integer"),
    ({"seed": True}, "seed must be an integer, not bool"),
])
def test_a_hostile_eval_json_never_reaches_a_table(tmp_path, changes, message):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(_eval(**changes)))
    with pytest.raises(TableError, match=message):
        load_evals([path])


def test_a_nan_score_is_refused_and_a_clean_record_loads(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(_eval()).replace("0.5", "NaN"))
    with pytest.raises(TableError, match="eval.json is not valid JSON: NaN"):
        load_evals([path])
    path.write_text(json.dumps(_eval(extra={"anything": "kept out"})))
    [loaded] = load_evals([path])
    assert loaded["test"] == {"64": {"final": 0.5}} and "extra" not in loaded
