"""What rgpt-export refuses as OUT (rgpt_dist/export/exporter.py, rgpt_dist/safe_paths.py): a file or a
link, the run being exported (or inside it, or above it), and with --overwrite anything but a previous
export; and the staging directories of interrupted exports. OUT is checked before the checkpoint is
read, so these use a stand-in run (one unverifiable checkpoint): an accepted OUT ends at "no complete
checkpoint", a refused one earlier. test_refusals_protect_a_real_run uses a real run (the shared
`runs` of tests/export/conftest.py), where a wrong --overwrite would delete it."""
import fcntl
import json
import os
import shutil

import pytest

from launcher.export import main as rgpt_export
from rgpt_dist.safe_paths import MARKER

RECORD = {"checkpoint": "/x/step_00000002", "step": 2, "weights": "w", "dtype": "fp32", "checksums_sha256": "0" * 64,
          "inference": {}}


def snapshot(root):
    """Every path under root (links not followed) with its content or link target: to show nothing changed."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            out[p] = os.readlink(p) if os.path.islink(p) else (open(p, "rb").read() if os.path.isfile(p) else "dir")
    return out


@pytest.fixture
def run(tmp_path):
    """A stand-in run directory: config, metrics and a checkpoint that does not verify."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000002").mkdir(parents=True)
    (run / "checkpoints" / "step_00000002" / "mp_rank_00_model_states.pt").write_bytes(b"weights")
    (run / "config.yaml").write_text("model: {}\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    return run


def fake_export(path, record=RECORD):
    (path / "native").mkdir(parents=True)
    (path / "hf").mkdir()
    (path / "native" / "model.safetensors").write_bytes(b"old")
    (path / "export.json").write_text(json.dumps(record))
    return path


def export(capsys, *args):
    code = rgpt_export([str(a) for a in args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_file_and_links_as_out_are_refused(run, tmp_path, capsys, overwrite):
    """A regular file, a dangling link and a link to a directory (even one holding an export) are
    refused by name, with or without --overwrite, and left as they were (the link's target too)."""
    (tmp_path / "file").write_text("notes")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    target = fake_export(tmp_path / "target")
    (tmp_path / "link").symlink_to(target)
    before = snapshot(tmp_path)
    for name, message in (("file", "is a regular file"), ("dangling", "is a dangling symbolic link"),
                          ("link", "is a symbolic link to a directory")):
        code, err = export(capsys, run, tmp_path / name, *overwrite)
        assert code == 2 and f"{tmp_path / name} {message}" in err, err
    assert snapshot(tmp_path) == before and not (tmp_path / "nowhere").exists()


def test_the_run_itself_inside_it_or_above_it_is_refused(run, tmp_path, capsys):
    """OUT = SRC, OUT inside SRC's run (also when SRC names its checkpoints/ or a step_*), OUT above
    SRC, and OUT reaching SRC through a linked parent: refused with --overwrite, nothing touched."""
    before = snapshot(tmp_path)
    tag = run / "checkpoints" / "step_00000002"
    (tmp_path / "alias").symlink_to(tmp_path)  # a linked parent: alias/run is the run
    cases = [(run, run, "is the run being exported"), (tag, run, "is the run being exported"),
             (run / "checkpoints", run / "checkpoints", "is inside the run being exported"),
             (run, run / "exports" / "x", "is inside the run being exported"),
             (tag, run / "x", "is inside the run being exported"),
             (run, tmp_path, "contains the run being exported"),
             (tag, tmp_path / "alias" / "run", "is the run being exported")]
    for src, out, message in cases:
        code, err = export(capsys, src, out, "--overwrite")
        assert code == 2 and f"{out} {message}" in err, (src, out, err)
    (tmp_path / "alias").unlink()
    assert snapshot(tmp_path) == before


def test_overwrite_replaces_only_a_previous_export(run, tmp_path, capsys):
    """--overwrite refuses a directory that is not exactly an export (other files, a bad record, a
    linked part), naming it; an export or an empty directory passes (and the stand-in run then fails)."""
    bad = {"notes": fake_export(tmp_path / "notes"), "record": fake_export(tmp_path / "record", {"step": 2}),
           "json": fake_export(tmp_path / "json"), "linked": fake_export(tmp_path / "linked"),
           "plain": tmp_path / "plain"}
    (bad["notes"] / "notes.txt").write_text("mine")
    (bad["json"] / "export.json").write_text("{not json")
    shutil.rmtree(bad["linked"] / "hf")
    (bad["linked"] / "hf").symlink_to(tmp_path / "notes")
    (bad["plain"] / "src").mkdir(parents=True)
    before = snapshot(tmp_path)
    for name, out in bad.items():
        code, err = export(capsys, run, out, "--overwrite")
        assert code == 2 and f"{out} is not an rgpt-export directory" in err, (name, err)
    assert "holds notes.txt" in export(capsys, run, bad["notes"], "--overwrite")[1]
    assert snapshot(tmp_path) == before
    for out in (fake_export(tmp_path / "previous"), tmp_path / "empty"):
        out.mkdir(exist_ok=True)
        code, err = export(capsys, run, out, "--overwrite")
        assert code == 2 and "no complete checkpoint" in err, err  # OUT accepted, the run is not exportable
        code, err = export(capsys, run, out)
        assert code == 2 and "exists: pass --overwrite" in err


def stale_staging(parent, name):
    d = parent / name
    d.mkdir()
    (d / MARKER).write_text("{}")
    (d / "native").mkdir()
    return d


def test_interrupted_exports_staging_is_removed_and_nothing_else(run, tmp_path, capsys):
    """The next export to OUT removes `.OUT.rgpt-export-XXXXXXXX` directories holding an unlocked
    marker, without following links inside them; it keeps ones without the marker, of another name,
    a link with that name, and one whose marker a live export holds locked."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    stale = stale_staging(tmp_path, ".exp.rgpt-export-abcd1234")
    (stale / "native" / "link").symlink_to(victim)
    kept = [stale_staging(tmp_path, ".exp.rgpt-export-zzzz9999"), stale_staging(tmp_path, ".exp.rgpt-export-old"),
            stale_staging(tmp_path, ".other.rgpt-export-abcd1234"), tmp_path / ".exp.rgpt-export-nomark12"]
    (kept[0] / MARKER).unlink()
    kept[-1].symlink_to(stale_staging(tmp_path, "elsewhere"))
    live = stale_staging(tmp_path, ".exp.rgpt-export-live1234")
    kept += [live, tmp_path / "elsewhere"]
    before = snapshot(tmp_path)
    with open(live / MARKER) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.warns(UserWarning, match=r"removed .*\.exp\.rgpt-export-abcd1234: the staging directory"):
            code, err = export(capsys, run, tmp_path / "exp")
    assert code == 2 and "no complete checkpoint" in err
    assert not os.path.lexists(stale) and all(os.path.lexists(p) for p in kept)
    assert snapshot(tmp_path) == {p: v for p, v in before.items() if not p.startswith(str(stale))}
    assert (victim / "keep").read_text() == "precious"


@pytest.mark.slow
def test_refusals_protect_a_real_run(runs, tmp_path, capsys):
    """On a real run, where the old --overwrite deleted it: OUT = the run, a directory above it and its
    checkpoints/ are refused and the run is untouched; a real export is then replaced by --overwrite,
    leaving no staging directory."""
    run = tmp_path / "runs" / "r"
    shutil.copytree(runs["zero0-trained"], run)
    before = snapshot(run)
    for out in (run, tmp_path / "runs", run / "checkpoints"):
        code, err = export(capsys, run, out, "--overwrite")
        assert code == 2 and "the run being exported" in err, err
    assert snapshot(run) == before
    out = tmp_path / "exp"
    assert export(capsys, run, out)[0] == 0
    record = json.loads((out / "export.json").read_text())
    (out / "export.json").write_text(json.dumps({**record, "step": -1}))  # to see that it was replaced
    assert export(capsys, run, out, "--overwrite")[0] == 0
    assert json.loads((out / "export.json").read_text()) == record
    assert sorted(os.listdir(tmp_path)) == ["exp", "runs"] and sorted(os.listdir(out)) == ["export.json", "hf", "native"]
