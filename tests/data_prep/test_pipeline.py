import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from data_prep import pipeline
from data_prep.cli import _parser, main
from tests.data_prep.checks import EOT, ROOT, expected_split, read_split, tree_bytes
from tests.data_prep.corpus import bad_corpus, good_corpus, many_batches_corpus


def test_shards_decode_to_the_accepted_documents_and_tokens_are_conserved(tmp_path, encoding):
    docs = good_corpus(tmp_path / "in")
    out, T, frac = tmp_path / "out", 16, 0.3
    assert main([str(tmp_path / "in"), "--out", str(out), "--seq-len", str(T), "--val-fraction", str(frac)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    ordered = [d for name in sorted(docs) for d in docs[name]]  # directory walk is sorted
    for split in ("train", "val"):
        mine = [d for d in ordered if expected_split(d, frac) == split]
        stream = [t for d in mine for t in encoding.encode_ordinary(d) + [EOT]]
        samples = read_split(out, split)
        m = manifest["splits"][split]
        assert samples.shape == (m["samples"], T + 1) and m["documents"] == len(mine)
        assert m["tokens"] == len(stream) == samples.size + m["remainder_tokens"]  # conservation
        assert 0 <= m["remainder_tokens"] < T + 1
        assert samples.flatten().tolist() == stream[: samples.size]
        # decoding: every document wholly inside the samples comes back exactly (split on the EOT
        # token, not on its text: a document may contain the literal string "<|endoftext|>")
        flat = samples.flatten().tolist()
        cuts = [-1] + [i for i, t in enumerate(flat) if t == EOT]
        pieces = [encoding.decode(flat[a + 1:b]) for a, b in zip(cuts, cuts[1:])] + [encoding.decode(flat[cuts[-1] + 1:])]
        assert pieces[:-1] == mine[: len(pieces) - 1] and mine[len(pieces) - 1].startswith(pieces[-1])
    assert manifest["splits"]["val"]["documents"] > 0 and manifest["skipped"]["counts"] == {}
    names = {Path(i["path"]).name: i for i in manifest["inputs"]}
    assert names["c.jsonl"]["sha256"] == hashlib.sha256((tmp_path / "in" / "c.jsonl").read_bytes()).hexdigest()
    assert sum(i["train"]["documents"] + i["val"]["documents"] for i in manifest["inputs"]) == len(ordered)
    assert manifest["tokenizer"]["vocab_sha256"].startswith("306cd27f") and manifest["seq_len"] == T
    assert not (tmp_path / "out.partial").exists()


def test_output_is_identical_for_one_and_two_workers(tmp_path, monkeypatch):
    """Many tokenizer batches per part, of very different sizes, 4 in flight on 2 workers: they finish
    out of order, and the bytes written must not show it."""
    size = many_batches_corpus(tmp_path / "in")
    monkeypatch.setattr(pipeline, "BATCH_BYTES", 2048)  # batches are cut in this process, before the pool
    batches = []
    real = pipeline._batches

    def counted(*a):
        for b in real(*a):
            batches.append(len(b[1]))
            yield b
    monkeypatch.setattr(pipeline, "_batches", counted)
    for w in (1, 2):
        assert main([str(tmp_path / "in"), "--out", str(tmp_path / f"w{w}"), "--seq-len", "8",
                     "--part-mb", "0.05", "--workers", str(w), "--val-fraction", "0.1"]) == 0
    one, two = tree_bytes(tmp_path / "w1"), tree_bytes(tmp_path / "w2")
    parts = json.loads(one["manifest.json"])["parts"]
    assert size > 100 * 2048 and len(batches) // 2 > 50 and len(parts) >= 4  # several parts of many batches
    assert one == two and len([k for k in one if k.endswith(".mds")]) > len(parts)


def test_bad_input_is_reported_counted_and_never_fatal(tmp_path, capsys):
    expected = bad_corpus(tmp_path / "in")
    out = tmp_path / "out"
    inputs = [str(tmp_path / "in"), str(tmp_path / "in" / "ok.txt"), str(tmp_path / "missing.jsonl"),
              str(tmp_path / "nomatch-*.txt")]
    assert main([*inputs, "--out", str(out), "--seq-len", "8", "--max-doc-mb", "0.004"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest["skipped"]["counts"]
    assert counts == {**expected, "duplicate input (same file)": 1, "input does not exist": 1,
                      "no file matches the pattern": 1}
    assert manifest["warnings"]["counts"] == {"invalid UTF-8 (replaced with U+FFFD)": 1}
    err = capsys.readouterr().err
    assert f"{tmp_path / 'in' / 'mixed.jsonl'}:2: malformed JSON" in err
    assert f"{tmp_path / 'in' / 'nulls.parquet'}:2: missing field 'text' (null)" in err
    items = {(Path(i["file"]).name, i.get("line"), i["reason"]) for i in manifest["skipped"]["items"]}
    assert ("mixed.jsonl", 4, "field 'text' is not a string") in items
    # what was valid is all there: ok, latin1 (repaired), 2 jsonl, 2 parquet rows, the corrupt gz's
    # lines before the cut
    per_file = {Path(i["path"]).name: i["train"]["documents"] + i["val"]["documents"] for i in manifest["inputs"]}
    assert 2000 < per_file.pop("corrupt.jsonl.gz") < 3000
    assert per_file == {"binary.txt": 0, "big.txt": 0, "empty.txt": 0, "latin1.txt": 1, "mixed.jsonl": 2,
                        "nocol.parquet": 0, "nulls.parquet": 2, "copy_of_ok.txt": 1}  # first of two copies
    assert "caf\ufffd cr\ufffdme" in _all_text(out)


def _all_text(out: Path) -> str:
    from rgpt_dist.data.tokenizer import get_encoding
    return get_encoding().decode(np.concatenate([read_split(out, s).flatten() for s in ("train", "val")]).tolist())


def test_exit_codes_for_nothing_valid_and_existing_output(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "empty.txt").write_text("")
    assert main([str(tmp_path / "in"), "--out", str(tmp_path / "out")]) == 1
    assert "no valid document was read; nothing written" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    (tmp_path / "in" / "doc.txt").write_text("one document")  # 3 tokens with <|endoftext|>
    assert main([str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--seq-len", "2"]) == 0
    assert main([str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--seq-len", "2"]) == 2
    assert "exists and is not empty; pass --overwrite" in capsys.readouterr().err
    assert main([str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--seq-len", "1", "--overwrite"]) == 0
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["seq_len"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for action in _parser()._actions:
        assert action.help, action.dest
        for opt in action.option_strings:
            assert opt in text
    assert "python-stdlib" in text and ".zst" in text


def _prep_cmd(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "data_prep.cli", str(src), "--out", str(out), "--seq-len", "32",
            "--part-mb", "0.25", "--workers", "2"]


@pytest.mark.slow
def test_killed_run_then_rerun_equals_an_uninterrupted_run(tmp_path):
    import sysconfig
    src = tmp_path / "in"
    src.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted((stdlib / "email").rglob("*.py")) + sorted((stdlib / "asyncio").glob("*.py")):
        (src / f"{p.parent.name}_{p.name}").write_bytes(p.read_bytes())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(_prep_cmd(src, tmp_path / "ref"), check=True, env=env, capture_output=True)
    out = tmp_path / "out"
    proc = subprocess.Popen(_prep_cmd(src, out), env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    marker = tmp_path / "out.partial" / "parts" / "part-00001.json"
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert marker.exists() and not out.exists(), "the run was not interrupted mid-way"
    rerun = subprocess.run(_prep_cmd(src, out), env=env, capture_output=True, text=True, check=True)
    assert "resuming the interrupted run" in rerun.stderr
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")
