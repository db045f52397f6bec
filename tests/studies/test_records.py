"""A study's finished runs kept in the checkout (issue #29): a record stands for a run only when it is
finished, on the same dataset, with the config the study would train now up to the machine's paths;
otherwise the run is trained again, and the reason is said. (The launcher's use of them, with real
runs: tests/studies/test_compare.py.)"""
import json

import pytest

from rgpt_dist.config.experiment import load_config
from rgpt_dist.studies import records
from rgpt_dist.studies.base import Run


def _config(tmp_path, where: str, *extra: str):
    return load_config("gpt2-debug", ["train.max_steps=2", "train.warmup_steps=1", f"data.paths=[{tmp_path / where}]",
                                      f"log.run_dir={tmp_path / where / 'run'}", *extra])


def _run_dir(tmp_path, where: str = "machine-a", steps_done: int = 2, *extra: str):
    """A run directory as the trainer leaves it: config.yaml and metrics.jsonl (records of steps_done)."""
    cfg = _config(tmp_path, where, *extra)
    run = tmp_path / where / "run"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(cfg.to_yaml())
    lines = [{"step": s, "loss": 10.0 - s, "tokens": 64 * s} for s in range(1, steps_done + 1)]
    lines.append({"step": steps_done, "val_loss": 9.5})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "manifest.json").write_text('{"shards": ["a"]}\n')
    return d


def test_a_record_made_on_another_machine_stands_for_the_same_run(tmp_path, data):
    run = _run_dir(tmp_path)
    records.launch_ended(run, 5.04, -9)  # killed, then resumed to the end: the record holds both launches
    records.launch_ended(run, 7.3, 0)
    rec = records.save(run, tmp_path / "rec" / "r", data_dir=data)
    meta = json.loads((rec / "record.json").read_text())
    assert meta["wall_s"] == 12.3 and meta["launches"] == 2 and meta["run"] == "run"
    assert meta["data_sha256"] == records.fingerprint(data)
    # the same run as machine b would train it: other data and run paths, everything else equal
    assert records.why_not(rec, _config(tmp_path, "machine-b"), data) is None
    out = tmp_path / "machine-b" / "out" / "r"
    records.restore(rec, out)
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "metrics.jsonl", "record.json"]
    assert (out / "metrics.jsonl").read_bytes() == (tmp_path / "machine-a" / "run" / "metrics.jsonl").read_bytes()
    assert records.wall_seconds([rec, rec, tmp_path / "missing"]) == pytest.approx(24.6)


def test_time_in_training_steps_counts_each_logged_window_once(tmp_path):
    """train_s: each logged window's tokens over its throughput, including windows of a launch the
    tally missed; evaluation rows and rows without throughput add nothing."""
    rows = [{"step": 10, "tokens": 1000, "tokens_per_s": 100.0},   # 10 s
            {"step": 20, "tokens": 2000, "tokens_per_s": 50.0},    # 20 s (e.g. an earlier, untallied launch)
            {"step": 20, "val_loss": 3.0},
            {"step": 25, "tokens": 2500},                           # no throughput logged
            {"step": 30, "tokens": 3000, "tokens_per_s": 250.0}]   # 4 s for the 1,000 tokens since step 20
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert records.train_seconds(tmp_path / "metrics.jsonl") == pytest.approx(34.0)


def _save(run, record_dir, data):
    records.launch_ended(run, 1.0, 0)
    return records.save(run, record_dir, data_dir=data)


def test_a_record_that_does_not_stand_for_the_run_says_why(tmp_path, data):
    rec = _save(_run_dir(tmp_path), tmp_path / "rec" / "r", data)
    assert "config.yaml differs" in records.why_not(rec, _config(tmp_path, "b", "train.lr=1e-3"), data)
    assert "config.yaml differs" in records.why_not(rec, _config(tmp_path, "b", "train.seed=7"), data)
    other = tmp_path / "other-data"
    other.mkdir()
    (other / "manifest.json").write_text('{"shards": ["b"]}\n')
    assert "another dataset" in records.why_not(rec, _config(tmp_path, "b"), other)
    assert records.why_not(tmp_path / "rec" / "none", _config(tmp_path, "b"), data) == "no record"
    half = _save(_run_dir(tmp_path, "machine-c", 1), tmp_path / "rec" / "half", data)
    assert "not finished (1/2" in records.why_not(half, _config(tmp_path, "b"), data)
    (rec / "record.json").unlink()  # written last: without it the record is incomplete
    assert records.why_not(rec, _config(tmp_path, "b"), data) == "no record"


def test_pending_restores_the_recorded_runs_and_keeps_the_others(tmp_path, data, capsys):
    runs = [Run(f"gpt2-debug-seed{s}", "configs/experiments/debug.yaml", "gpt2", s) for s in (1, 2, 3)]
    _save(_run_dir(tmp_path), tmp_path / "rec" / runs[0].name, data)
    _save(_run_dir(tmp_path, "machine-c"), tmp_path / "rec" / runs[1].name, data)
    configs = {runs[0].name: _config(tmp_path, "b"), runs[1].name: _config(tmp_path, "b", "train.lr=1e-3"),
               runs[2].name: _config(tmp_path, "b")}
    todo = records.pending(runs, configs, tmp_path / "rec", tmp_path / "out", data)
    assert todo == runs[1:]
    assert (tmp_path / "out" / runs[0].name / "metrics.jsonl").is_file()
    assert not (tmp_path / "out" / runs[1].name).exists()
    said = capsys.readouterr().out
    assert f"{runs[0].name}: recorded in" in said and f"{runs[1].name}: trained again:" in said
    assert runs[2].name not in said  # never recorded: nothing to say
