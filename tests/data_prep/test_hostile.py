"""rgpt-prep keeps its contract on hostile input (issue 12): every bad item is reported with file:line
and counted, the run completes with the documented exit code, every valid document is in the shards
(token conservation), and nothing rgpt-prep did not make is deleted or opened."""
import json
import os
from pathlib import Path

import pytest
import zstandard

from data_prep.cli import main
from data_prep.output import prepare_staging
from tests.data_prep.checks import assert_conserved, manifest, prep, read_split
from tests.data_prep.corpus import hostile_corpus

FRACTION, SEQ = 0.3, 8


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """One rgpt-prep run (a subprocess with a timeout: a FIFO or /dev/zero would hang it) over every
    hostile case at once, shared by the tests below."""
    tmp = tmp_path_factory.mktemp("hostile")
    spec = hostile_corpus(tmp / "in", tmp / "outside")
    out = tmp / "out"
    done = prep(str(tmp / "in"), *spec["direct"], "--out", str(out), "--seq-len", str(SEQ),
                "--val-fraction", str(FRACTION), "--max-doc-mb", "0.2", timeout=120)
    assert done.returncode == 0, done.stderr
    return {**spec, "in": tmp / "in", "outside": tmp / "outside", "out": out, "err": done.stderr,
            "manifest": manifest(out)}


def assert_reported(h: dict, name: str, line: int | None, reason: str) -> None:
    """On stderr as file:line (or file) and listed in manifest.json with its line."""
    path = name if os.path.isabs(name) else str(h["in"] / name)
    where = f"{path}:{line}" if line is not None else path
    assert f"skipped {where}: {reason}" in h["err"], (where, reason)
    items = [(i["file"], i.get("line"), i["reason"]) for i in h["manifest"]["skipped"]["items"]]
    assert (path, line, reason) in items


def per_file_documents(h: dict) -> dict[str, int]:
    return {Path(i["path"]).name: i["train"]["documents"] + i["val"]["documents"] for i in h["manifest"]["inputs"]}


def test_hostile_run_keeps_every_valid_document(hostile, encoding):
    docs = hostile["docs"]
    assert per_file_documents(hostile) == {name: len(d) for name, d in docs.items()}
    ordered = [d for name in sorted(docs) for d in docs[name]]  # directories are walked sorted
    assert_conserved(hostile["out"], ordered, FRACTION, encoding)
    assert len(hostile["manifest"]["parts"]) == 1  # assert_conserved's premise


def test_lone_surrogates_are_counted_skips(hostile):
    for line in (2, 8):
        assert_reported(hostile, "a_lines.jsonl", line, "lone surrogate (not valid Unicode)")
    assert hostile["manifest"]["skipped"]["counts"]["lone surrogate (not valid Unicode)"] == 2


def test_deep_nesting_and_huge_numbers_are_counted_skips(hostile):
    assert_reported(hostile, "a_lines.jsonl", 3, "JSON nested too deeply")
    assert_reported(hostile, "a_lines.jsonl", 4, "unparseable JSON")


def test_fifos_and_devices_are_skipped_without_being_opened(hostile):
    """A FIFO and a link to /dev/zero in the directory, and both named directly: reported, and the
    run ended (a FIFO with no writer blocks open(); /dev/zero never ends)."""
    for name in ("e_fifo.jsonl", "f_zero.txt", *hostile["direct"]):
        assert_reported(hostile, name, None, "not a regular file")
    assert hostile["manifest"]["skipped"]["counts"]["not a regular file"] == 4
    assert_reported(hostile, "i_linked_dir", None, "symbolic link to a directory (not followed)")
    assert (hostile["outside"] / "not_followed.txt").exists() and (hostile["in"] / "e_fifo.jsonl").is_fifo()
    assert "not_followed" not in json.dumps(hostile["manifest"]["inputs"])


def test_long_line_is_skipped_and_the_rest_of_the_file_read(hostile):
    assert_reported(hostile, "a_lines.jsonl", 6, "document too large")
    assert per_file_documents(hostile)["a_lines.jsonl"] == 4  # the lines after it too


def test_dictionary_and_large_string_parquet_columns_are_read(hostile):
    counts = per_file_documents(hostile)
    assert counts["b_dict.parquet"] == 4 and counts["c_large.parquet"] == 2
    assert_reported(hostile, "b_dict.parquet", 4, "missing field 'text' (null)")
    # invalid UTF-8 in one Parquet value is repaired like anywhere else, not a crash of the file
    assert counts["d_latin1.parquet"] == 2
    assert {"file": str(hostile["in"] / "d_latin1.parquet"), "line": 1,
            "reason": "invalid UTF-8 (replaced with U+FFFD)"} in hostile["manifest"]["warnings"]["items"]


def test_damaged_deflate_stream_is_reported(hostile):
    assert_reported(hostile, "g_damaged.jsonl.gz", None, "unreadable or corrupt file (stopped reading)")
    assert "error: Error -3 while decompressing" in hostile["err"]


def _memory_mb(key: str) -> float:
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1]) / 1024


def _long_line_file(path: Path, before: str, after: str, mb: int, compress: bool) -> None:
    with open(path, "wb") as raw:
        fh = zstandard.ZstdCompressor(level=1).stream_writer(raw) if compress else raw
        fh.write((json.dumps({"text": before}) + '\n{"text": "').encode())
        for _ in range(mb):
            fh.write(b"x" * 2**20)
        fh.write(('"}\n' + json.dumps({"text": after}) + "\n").encode())
        if compress:
            fh.flush(zstandard.FLUSH_FRAME)


def test_memory_does_not_grow_with_line_length(tmp_path, encoding):
    """A 200 MB JSONL line (plain and zstd) under --max-doc-mb 1: skipped while streaming, so the peak
    memory of the run (VmHWM, reset just before it) stays far below the line's size; the lines around
    it are kept."""
    for d, mb in (("warm", 2), ("big", 200)):
        (tmp_path / d).mkdir()
        _long_line_file(tmp_path / d / "plain.jsonl", f"{d} before", f"{d} after", mb, compress=False)
        _long_line_file(tmp_path / d / "packed.jsonl.zst", f"{d} zst before", f"{d} zst after", mb, compress=True)
    out, opts = tmp_path / "out", ["--seq-len", "4", "--max-doc-mb", "1", "--no-progress"]
    assert main([str(tmp_path / "warm"), "--out", str(tmp_path / "warm-out"), *opts]) == 0  # every code path once
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS to the current RSS
    except OSError as e:
        pytest.skip(f"cannot reset the peak RSS (/proc/self/clear_refs, Linux >= 4.0): {e}")
    before = _memory_mb("VmRSS")
    assert main([str(tmp_path / "big"), "--out", str(out), *opts]) == 0
    assert _memory_mb("VmHWM") - before < 40
    (tmp_path / "big" / "plain.jsonl").unlink()  # 200 MB: not kept until the session ends
    skipped = {(Path(i["file"]).name, i["line"], i["reason"], i["detail"]) for i in manifest(out)["skipped"]["items"]}
    assert skipped == {(name, 2, "document too large", "line over 1048576 bytes")
                       for name in ("packed.jsonl.zst", "plain.jsonl")}
    docs = ["big zst before", "big zst after", "big before", "big after"]
    assert_conserved(out, docs, manifest(out)["options"]["val_fraction"], encoding)


def _one_doc(tmp_path: Path, text: str = "one small document") -> str:
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "in" / "doc.txt").write_text(text)
    return str(tmp_path / "in")


def test_unrelated_partial_directory_is_refused_and_left_intact(tmp_path, capsys):
    src, out = _one_doc(tmp_path), tmp_path / "out"
    mine = tmp_path / "out.partial"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    (mine / "plan.json").write_text('{"fingerprint": "an old plan file, not rgpt-prep\'s"}')
    for extra in ([], ["--no-resume"], ["--overwrite"]):
        assert main([src, "--out", str(out), "--seq-len", "2", *extra]) == 2
        err = capsys.readouterr().err
        assert f"{mine} exists and was not made by rgpt-prep" in err
        assert (mine / "thesis.tex").read_text() == "years of work" and not out.exists()
    (mine / "thesis.tex").unlink()
    (mine / "plan.json").unlink()
    assert main([src, "--out", str(out), "--seq-len", "2"]) == 0  # an empty one is taken: nothing to lose
    prepare_staging(mine, "a run of rgpt-prep with other options", resume=True)
    assert main([src, "--out", str(out), "--seq-len", "2", "--overwrite"]) == 0  # its own: discarded
    assert "discarding the interrupted run" in capsys.readouterr().err and not mine.exists()


def test_unrelated_old_directories_survive_an_overwrite(tmp_path, capsys):
    src, out = _one_doc(tmp_path), tmp_path / "out"
    assert main([src, "--out", str(out), "--seq-len", "2"]) == 0
    old, aside = tmp_path / "out.old", tmp_path / ".out.old"
    for d in (old, aside):
        d.mkdir()
        (d / "keep.txt").write_text("not rgpt-prep's")
    assert main([src, "--out", str(out), "--seq-len", "1", "--overwrite"]) == 2  # .out.old: a name swap_dir may use
    assert f"{aside} exists" in capsys.readouterr().err and manifest(out)["seq_len"] == 2
    (aside / "keep.txt").unlink()
    aside.rmdir()
    assert main([src, "--out", str(out), "--seq-len", "1", "--overwrite"]) == 0
    assert manifest(out)["seq_len"] == 1 and (old / "keep.txt").read_text() == "not rgpt-prep's"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "train", "val"]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert main([src, "--out", str(other), "--overwrite"]) == 2  # not a dataset: never replaced
    assert "is not an rgpt-prep dataset" in capsys.readouterr().err and (other / "keep.txt").exists()


@pytest.mark.parametrize("case", ["file", "under-a-file", "dot", "dotdot", "root", "link"])
def test_bad_out_is_a_usage_error(tmp_path, monkeypatch, capsys, case):
    src = _one_doc(tmp_path)
    (tmp_path / "file").write_text("a file")
    (tmp_path / "work" / "sub").mkdir(parents=True)
    (tmp_path / "work" / "sub" / "x.txt").write_text("x")
    os.symlink(tmp_path / "work", tmp_path / "link")
    monkeypatch.chdir(tmp_path / "work" / "sub")
    out = {"file": str(tmp_path / "file"), "under-a-file": str(tmp_path / "file" / "out"), "dot": ".",
           "dotdot": "..", "root": "/", "link": str(tmp_path / "link")}[case]
    assert main([src, "--out", out, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}" in err and "Traceback" not in err
    assert (tmp_path / "file").read_text() == "a file" and (tmp_path / "work" / "sub" / "x.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "in", "link", "work"]


def test_too_few_tokens_for_one_sample_is_an_error_and_leaves_nothing(tmp_path, capsys):
    src, out = _one_doc(tmp_path, "one document"), tmp_path / "out"  # 2 tokens + <|endoftext|>
    assert main([src, "--out", str(out), "--seq-len", "64"]) == 1
    assert "1 documents, 3 tokens: fewer than one sample of seq_len+1 = 65 tokens" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    assert main([src, "--out", str(out), "--seq-len", "2"]) == 0
    assert main([src, "--out", str(out), "--seq-len", "64", "--overwrite"]) == 1  # the old dataset stays
    assert manifest(out)["seq_len"] == 2 and len(read_split(out, "train")) + len(read_split(out, "val")) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


def test_files_are_fsynced_before_the_renames_that_publish_them(tmp_path, monkeypatch):
    """Each part's record is renamed into place after every shard file of the part is on disk, and
    every file and directory of OUT (and OUT's entry in its parent) was fsynced."""
    from tests.data_prep.corpus import good_corpus
    good_corpus(tmp_path / "in")
    synced, record_renames = [], {}
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append(os.fstat(fd).st_ino)
        return real_fsync(fd)

    def replace(src, dst, **kw):
        if Path(dst).parent.name == "parts":
            record_renames[Path(dst).stem] = len(synced)
        return real_replace(src, dst, **kw)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    out = tmp_path / "out"
    assert main([str(tmp_path / "in"), "--out", str(out), "--seq-len", "8", "--part-mb", "0.001"]) == 0
    assert len(record_renames) >= 3
    for part, at in record_renames.items():
        shards = [p for s in ("train", "val") for p in (out / s / part).iterdir()]
        assert shards and all(p.stat().st_ino in synced[:at] for p in shards), part
    for p in [out, *out.rglob("*")]:
        assert p.stat().st_ino in synced, p
    assert tmp_path.stat().st_ino in synced[-10:]
