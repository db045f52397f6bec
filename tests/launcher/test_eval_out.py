"""rgpt-eval --out (launcher/eval.py, rgpt_dist/safe_paths.py): a file, a dangling link or a link to a
directory is refused; a plain directory is added to (several commands share one), but never through
a link planted in it; an interrupted run's staging directory is removed by the next run. Uses
`rgpt-eval curve` on a native export of a tiny random model (one batch)."""
import fcntl
import json
import os

import pytest
import torch

from launcher.eval import main as rgpt_eval
from rgpt_dist.config import RecurrentGPTConfig
from rgpt_dist.registry import build_model
from rgpt_dist.safe_paths import MARKER

OUTPUTS = ["early_exit.csv", "early_exit.json", "early_exit.png"]


@pytest.fixture(scope="module")
def source(tmp_path_factory, dataset):
    from rgpt_dist.checkpoints.native import write_native

    cfg = RecurrentGPTConfig(n_pre=1, n_rec=1, n_coda=1, n_loops=1, vocab_size=50257, block_size=32, d_model=16,
                             n_head=2)
    root = tmp_path_factory.mktemp("eval-out") / "exp"
    meta = {"step": 1, "data": {"paths": [str(dataset)], "val_split": "val", "seq_len": 32}}
    write_native(build_model(cfg, seed=0).state_dict(), cfg, root / "native", torch.float32, meta)
    return root


def curve(capsys, source, out):
    code = rgpt_eval(["curve", str(source), "--out", str(out), "--batches", "1", "--batch-size", "2",
                      "--depths", "0,1", "--device", "cpu"])
    return code, capsys.readouterr().err


def test_file_and_links_as_out_are_refused(source, tmp_path, capsys):
    (tmp_path / "file").write_text("notes")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    for name, message in (("file", "is a regular file"), ("dangling", "is a dangling symbolic link"),
                          ("link", "is a symbolic link to a directory")):
        code, err = curve(capsys, source, tmp_path / name)
        assert code == 2 and f"rgpt-eval: {tmp_path / name} {message}" in err, err
    assert (tmp_path / "file").read_text() == "notes" and not os.path.lexists(tmp_path / "nowhere")
    assert os.listdir(tmp_path / "target") == []


def test_a_failed_command_leaves_no_out(tmp_path, capsys):
    """OUT (and the parents made for it) are removed again when the command fails."""
    code, err = curve(capsys, tmp_path / "nothing", tmp_path / "new" / "out")
    assert code == 2 and "does not exist" in err and os.listdir(tmp_path) == []


def test_links_planted_in_out_are_refused_and_nothing_is_written(source, tmp_path, capsys):
    """A link at an output's name (to a file elsewhere, or dangling) is refused by name: the target is
    unchanged and no output lands in OUT (all or nothing), no staging directory is left."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "early_exit.json").symlink_to(victim)
    code, err = curve(capsys, source, out)
    assert code == 2 and f"{out / 'early_exit.json'} is a symbolic link" in err and "write through" in err, err
    assert victim.read_text() == "precious" and os.listdir(out) == ["early_exit.json"]
    (out / "early_exit.json").unlink()
    (out / "early_exit.png").symlink_to(tmp_path / "planted.png")
    code, err = curve(capsys, source, out)
    assert code == 2 and f"{out / 'early_exit.png'} is a symbolic link" in err, err
    assert not os.path.lexists(tmp_path / "planted.png") and os.listdir(out) == ["early_exit.png"]


def test_reports_are_added_to_a_plain_directory(source, tmp_path, capsys):
    """Another command's report stays, this command's files are replaced, the new files are whole and
    no hidden directory is left (the Makefile's quickstart-eval writes three commands into one OUT)."""
    out = tmp_path / "eval" / "quickstart"
    out.mkdir(parents=True)
    (out / "lm_eval_results.json").write_text("{}")
    (out / "early_exit.json").write_text("old")
    assert curve(capsys, source, out)[0] == 0
    assert sorted(os.listdir(out)) == sorted(OUTPUTS + ["lm_eval_results.json"])
    assert (out / "lm_eval_results.json").read_text() == "{}"
    assert [r["depth"] for r in json.loads((out / "early_exit.json").read_text())] == [0, 1]


def test_an_interrupted_runs_staging_is_removed(source, tmp_path, capsys):
    """`.rgpt-eval-partial-XXXXXXXX` with an unlocked marker goes (links in it not followed); one
    without the marker, or whose marker a live run holds locked, stays."""
    out = tmp_path / "out"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    dirs = {}
    for name in ("stale", "nomark", "live"):
        dirs[name] = out / f".rgpt-eval-partial-{name:_<8}"
        dirs[name].mkdir(parents=True)
        (dirs[name] / MARKER).write_text("{}")
        (dirs[name] / "link").symlink_to(victim)
    (dirs["nomark"] / MARKER).unlink()
    with open(dirs["live"] / MARKER) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.warns(UserWarning, match="the staging directory of an interrupted run"):
            assert curve(capsys, source, out)[0] == 0
    assert sorted(os.listdir(out)) == sorted(OUTPUTS + [dirs["live"].name, dirs["nomark"].name])
    assert os.listdir(victim) == ["keep"] and (victim / "keep").read_text() == "precious"
