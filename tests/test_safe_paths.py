"""rgpt_dist.safe_paths: publishing staged outputs into a shared directory never writes through a link."""
import os

import pytest

from rgpt_dist.safe_paths import MARKER, UnsafeOutput, out_dir, publish, staging


def staged(tmp_path):
    s = tmp_path / "staged"
    (s / "sub").mkdir(parents=True)
    (s / "a.json").write_text("new a")
    (s / "sub" / "b.csv").write_text("new b")
    (s / MARKER).write_text("{}")
    return s


@pytest.mark.parametrize("plant", ["dir-link", "fifo", "dir-at-file"])
def test_publish_refuses_before_moving_anything(tmp_path, plant):
    """A link where an output directory goes (its files would land in the target), a FIFO or a
    directory where a file goes: refused by name, and no file of the batch is moved."""
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.mkdir()
    bad = {"dir-link": out / "sub", "fifo": out / "sub" / "b.csv", "dir-at-file": out / "sub" / "b.csv"}[plant]
    if plant == "dir-link":
        bad.symlink_to(victim)
    else:
        (out / "sub").mkdir()
        if plant == "fifo":
            os.mkfifo(bad)
        else:
            bad.mkdir()
    src = staged(tmp_path)
    with pytest.raises(UnsafeOutput, match=str(bad)):
        publish(src, out)
    assert os.listdir(victim) == [] and not (out / "a.json").exists() and (src / "a.json").exists()


def test_publish_merges_and_keeps_the_marker_out(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "b.csv").write_text("old b")
    (out / "sub" / "other").write_text("kept")
    assert publish(staged(tmp_path), out) == [out / "a.json", out / "sub" / "b.csv"]
    assert (out / "sub" / "b.csv").read_text() == "new b" and (out / "sub" / "other").read_text() == "kept"
    assert sorted(os.listdir(out)) == ["a.json", "sub"]


def test_out_dir_resolves_ancestors_not_the_last_component(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert out_dir(tmp_path / "alias" / "x") == tmp_path / "real" / "x"
    with pytest.raises(UnsafeOutput, match="alias is a symbolic link to a directory"):
        out_dir(tmp_path / "alias")


def test_staging_is_removed_however_the_block_ends(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with staging(tmp_path, ".x.rgpt-test-") as tmp:
            (tmp / "f").write_text("partial")
            assert (tmp / MARKER).is_file() and oct(tmp.stat().st_mode & 0o777) == "0o700"
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []
