"""Records under attack (security issue, third round): restoring a record never writes through a link
planted in the output directory, and a damaged or hostile record (merge conflict markers, wrong
types, NaN, a FIFO, a huge file, links) is refused with an error naming the file and the field --
`rgpt study ... run --record` exits 2 before training anything -- instead of a traceback, a block or
a silently wrong sum. (docs/security.md, "Study records".)"""
import json
import os

import pytest

from rgpt_dist.studies import records
from tests.helpers.fifo import no_block
from tests.studies.test_records import _config, _run_dir, data  # noqa: F401 (data: a fixture)


@pytest.fixture
def rec(tmp_path, data):
    """A good record of a finished run, at rec/r."""
    run = _run_dir(tmp_path)
    records.launch_ended(run, 3.0, 0)
    return records.save(run, tmp_path / "rec" / "r", data_dir=data)


@pytest.fixture
def victim(tmp_path):
    """Another user's directory, with one file in it: nothing may change in it."""
    d = tmp_path / "victim"
    d.mkdir()
    (d / "metrics.jsonl").write_text("theirs\n")
    return d


def _snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


# --- restore: never through a link ----------------------------------------------------------------

def test_restore_refuses_a_link_planted_at_the_run_directory(tmp_path, rec, victim):
    before = _snapshot(victim)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "r").symlink_to(victim)
    with pytest.raises(records.RecordError, match="out/r is a symbolic link: refusing to restore through it"):
        records.restore(rec, tmp_path / "out" / "r")
    assert _snapshot(victim) == before  # not overwritten, and no config.yaml / record.json created there


def test_restore_refuses_a_link_planted_at_metrics_jsonl(tmp_path, rec, victim):
    before = _snapshot(victim)
    out = tmp_path / "out" / "r"
    out.mkdir(parents=True)
    (out / "metrics.jsonl").symlink_to(victim / "metrics.jsonl")
    with pytest.raises(records.RecordError, match="metrics.jsonl is a symbolic link: refusing to restore through it"):
        records.restore(rec, out)
    assert _snapshot(victim) == before
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]  # refused before anything was written


def test_restore_refuses_a_dangling_link_planted_at_config_yaml(tmp_path, rec, victim):
    before = _snapshot(victim)
    out = tmp_path / "out" / "r"
    out.mkdir(parents=True)
    (out / "config.yaml").symlink_to(victim / "config.yaml")  # would create a file in the victim's directory
    with pytest.raises(records.RecordError, match="config.yaml is a symbolic link: refusing to restore through it"):
        records.restore(rec, out)
    assert _snapshot(victim) == before and not (victim / "config.yaml").exists()


def test_restore_refuses_a_fifo_or_a_directory_where_a_file_goes(tmp_path, rec):
    out = tmp_path / "out" / "r"
    out.mkdir(parents=True)
    os.mkfifo(out / "record.json")
    (out / "config.yaml").mkdir()
    with pytest.raises(records.RecordError, match="is a FIFO, not a regular file: refusing to restore"):
        no_block(lambda: records.restore(rec, out), out / "record.json")


def test_restore_through_the_launcher_exits_2_and_trains_nothing(tmp_path, monkeypatch, victim):
    """launcher/compare.py --record with a link planted at a recorded run's directory in --out."""
    import launcher.compare as launcher
    from rgpt_dist.studies import runner

    name = "mor-small-isoflops-seed42"
    (tmp_path / "rec" / name).mkdir(parents=True)
    for f in ("config.yaml", "metrics.jsonl", "record.json"):
        (tmp_path / "rec" / name / f).write_text("x\n")
    monkeypatch.setattr(records, "why_not", lambda d, cfg, data: None if d.name == name else "no record")
    trained = []
    monkeypatch.setattr(runner, "run_all", lambda todo, *a, **k: trained.extend(r.name for r in todo) or [])
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / name).symlink_to(victim)
    before = _snapshot(victim)
    assert launcher.main(["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--preset", "long",
                          "--record", str(tmp_path / "rec")]) == 2
    assert trained == [] and _snapshot(victim) == before


# --- record.json: one bounded reader, a typed schema ----------------------------------------------

def _meta(rec):
    return json.loads((rec / "record.json").read_text())


def _why_not(tmp_path, rec, data):
    return records.why_not(rec, _config(tmp_path, "machine-b"), data)


def test_the_good_record_is_read_and_stands(tmp_path, rec, data):
    meta = records.read_record(rec / "record.json")
    assert meta.run == "run" and meta.launches == 1 and meta.wall_s == 3.0 and meta.cpus == os.cpu_count()
    assert _why_not(tmp_path, rec, data) is None


@pytest.mark.parametrize("text, says", [
    (b'<<<<<<< HEAD\n{"run": "r"}\n=======\n{"run": "s"}\n>>>>>>> other\n', "merge conflict marker"),
    (b"[1, 2, 3]\n", "not a JSON object"),
    (b"", "not valid JSON"),
    (b'{"run": NaN}', "NaN is not a number JSON allows"),   # strict JSON, as rgpt_dist.strict_json writes it
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested"),
])
def test_a_record_json_that_is_not_a_record_is_refused_naming_it(tmp_path, rec, data, text, says):
    (rec / "record.json").write_bytes(text)
    with pytest.raises(records.RecordError, match=says) as e:
        _why_not(tmp_path, rec, data)
    assert str(rec / "record.json") in str(e.value)


@pytest.mark.parametrize("field, value, says", [
    ("wall_s", "12.0", "wall_s"),                 # a string for a number
    ("wall_s", float("nan"), "NaN"),              # not JSON (Python's json writes it): refused as it is read
    ("train_s", float("inf"), "Infinity"),
    ("train_s", "1e999", "train_s"),              # a literal that parses to inf: refused by the schema
    ("wall_s", 1e300, "wall_s"),                  # finite, but no run's
    ("launches", 1.5, "launches"),
    ("launches", True, "launches"),
    ("launches", 10 ** 30, "launches"),
    ("cpus", -2, "cpus"),
    ("data_sha256", 7, "data_sha256"),
    ("data_sha256", "not a hash", "data_sha256"),
    ("finished_utc", "yesterday", "finished_utc"),
    ("run", "../../elsewhere", "run"),             # a name from the record is one plain path component
    ("run", "/abs", "run"),
    ("run", "a\x00b", "run"),
    ("run", ["r"], "run"),
    ("note", {"nested": 1}, "note"),
    ("surprise", 1, "surprise"),                  # an unknown field
    ("data_sha256", None, None),                  # generated tasks: allowed (the data check says why not)
])
def test_a_field_of_the_wrong_type_or_range_is_refused_naming_the_field(tmp_path, rec, data, field, value, says):
    meta = _meta(rec)
    meta[field] = value
    text = json.dumps(meta)
    if value == "1e999":
        text = text.replace('"1e999"', "1e999")
    (rec / "record.json").write_text(text)
    if says is None:
        assert "another dataset" in _why_not(tmp_path, rec, data)
        return
    with pytest.raises(records.RecordError, match=f"{rec / 'record.json'}.*{says}"):
        _why_not(tmp_path, rec, data)


def test_a_missing_field_and_a_number_too_long_are_refused(tmp_path, rec, data):
    meta = _meta(rec)
    del meta["launches"]
    (rec / "record.json").write_text(json.dumps(meta))
    with pytest.raises(records.RecordError, match="launches"):
        _why_not(tmp_path, rec, data)
    (rec / "record.json").write_text(json.dumps(_meta_good(tmp_path, data)).replace('"launches": 1',
                                                                                  '"launches": ' + "9" * 5000))
    with pytest.raises(records.RecordError, match="record.json"):
        _why_not(tmp_path, rec, data)


def _meta_good(tmp_path, data):
    run = _run_dir(tmp_path, "machine-z")
    records.launch_ended(run, 1.0, 0)
    return json.loads((records.save(run, tmp_path / "rec-z", data_dir=data) / "record.json").read_text())


def test_a_fifo_at_record_json_is_refused_without_blocking(tmp_path, rec, data):
    (rec / "record.json").unlink()
    os.mkfifo(rec / "record.json")
    with pytest.raises(records.RecordError, match=f"{rec / 'record.json'} is a FIFO"):
        no_block(lambda: _why_not(tmp_path, rec, data), rec / "record.json")


def test_a_fifo_or_link_among_the_record_files_is_refused(tmp_path, rec, data, victim):
    (rec / "metrics.jsonl").unlink()
    os.mkfifo(rec / "metrics.jsonl")
    with pytest.raises(records.RecordError, match="metrics.jsonl is a FIFO"):
        no_block(lambda: _why_not(tmp_path, rec, data), rec / "metrics.jsonl")
    (rec / "metrics.jsonl").unlink()
    (rec / "metrics.jsonl").symlink_to(victim / "metrics.jsonl")
    with pytest.raises(records.RecordError, match="metrics.jsonl is a symbolic link"):
        _why_not(tmp_path, rec, data)


def test_a_record_directory_that_is_a_link_is_refused(tmp_path, rec, data):
    (tmp_path / "rec" / "linked").symlink_to(rec)
    with pytest.raises(records.RecordError, match="linked is a symbolic link"):
        records.why_not(tmp_path / "rec" / "linked", _config(tmp_path, "machine-b"), data)


def test_a_huge_record_json_is_refused_unread(tmp_path, rec, data):
    with open(rec / "record.json", "r+b") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of NULs after the record
    with pytest.raises(records.RecordError, match=f"{rec / 'record.json'} is larger than 1,048,576 bytes"):
        _why_not(tmp_path, rec, data)


def test_pending_refuses_every_unusable_record_before_restoring_any(tmp_path, data):
    from rgpt_dist.studies.base import Run

    runs = [Run(f"gpt2-debug-seed{s}", "configs/experiments/debug.yaml", "gpt2", s) for s in (1, 2, 3)]
    for r in runs[:2]:
        run = _run_dir(tmp_path, f"m-{r.name}")
        records.launch_ended(run, 1.0, 0)
        records.save(run, tmp_path / "rec" / r.name, data_dir=data)
    (tmp_path / "rec" / runs[1].name / "record.json").write_text("<<<<<<< HEAD\n{}\n=======\n{}\n>>>>>>> x\n")
    (tmp_path / "rec" / runs[2].name).mkdir()
    (tmp_path / "rec" / runs[2].name / "record.json").write_text("[]")
    configs = {r.name: _config(tmp_path, "b") for r in runs}
    with pytest.raises(records.RecordError) as e:
        records.pending(runs, configs, tmp_path / "rec", tmp_path / "out", data)
    assert runs[1].name in str(e.value) and runs[2].name in str(e.value)
    assert not (tmp_path / "out").exists()  # runs[0]'s good record was not restored either


def test_the_launcher_refuses_a_malformed_record_with_exit_2(tmp_path, monkeypatch, capsys):
    import launcher.compare as launcher
    from rgpt_dist.studies import runner

    name = "gpt2-small-seed42"
    (tmp_path / "rec" / name).mkdir(parents=True)
    (tmp_path / "rec" / name / "record.json").write_text('<<<<<<< HEAD\n{"wall_s": 1}\n=======\n{}\n>>>>>>> x\n')
    trained = []
    monkeypatch.setattr(runner, "run_all", lambda todo, *a, **k: trained.extend(r.name for r in todo) or [])
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    assert launcher.main(["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--preset", "long",
                          "--record", str(tmp_path / "rec")]) == 2
    assert trained == []
    err = capsys.readouterr().err
    assert str(tmp_path / "rec" / name / "record.json") in err and "merge conflict marker" in err


def test_the_summed_time_leaves_out_an_unusable_record_and_says_so(tmp_path, rec, capsys):
    bad = tmp_path / "rec" / "bad"
    bad.mkdir()
    (bad / "record.json").write_text('{"wall_s": "1e9"}')
    fifo = tmp_path / "rec" / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "record.json")
    total = no_block(lambda: records.wall_seconds([rec, bad, fifo, tmp_path / "missing"]), fifo / "record.json")
    assert total == pytest.approx(3.0)
    err = capsys.readouterr().err
    assert str(bad / "record.json") in err and str(fifo / "record.json") in err


# --- the run's own files: no write through a link there either -------------------------------------

def test_the_launch_tally_is_not_appended_through_a_link(tmp_path, victim):
    run = tmp_path / "out" / "r"
    run.mkdir(parents=True)
    (run / records.LAUNCHES).symlink_to(victim / "metrics.jsonl")
    before = _snapshot(victim)
    with pytest.raises(records.RecordError, match="is a symbolic link"):
        records.launch_ended(run, 1.0, 0)
    assert _snapshot(victim) == before


def test_save_refuses_a_record_directory_that_is_a_link(tmp_path, data, victim):
    run = _run_dir(tmp_path)
    records.launch_ended(run, 1.0, 0)
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "r").symlink_to(victim)
    before = _snapshot(victim)
    with pytest.raises(records.RecordError, match="is a symbolic link"):
        records.save(run, tmp_path / "rec" / "r", data_dir=data)
    assert _snapshot(victim) == before


def test_save_refuses_a_file_name_that_leaves_the_run(tmp_path, data):
    run = _run_dir(tmp_path)
    for name in ("../escape", "/etc/passwd", "a/../../b", ""):
        with pytest.raises(records.RecordError, match="not a plain relative path"):
            records.save(run, tmp_path / "rec" / "r", data_dir=data, files=("config.yaml", name))
