"""rgpt-prep stays bounded on hostile input (issue 23): Parquet that decompresses to far more than
its size is skipped by its metadata or value lengths (memory stays far below the decompressed size),
recursive globs through self-referencing links end, and two runs into one --out cannot mix."""
import fcntl
import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.output import lock_file
from tests.data_prep.checks import ROOT, manifest, prep

MB = 2**20
# rgpt-prep in a child process that reports its peak resident memory (VmHWM: since its exec, unlike
# ru_maxrss, which keeps the forking parent's peak) and the peak of Arrow's memory pool.
MEASURED = """
import re, sys
import pyarrow as pa
from data_prep.cli import main
rc = main(sys.argv[1:])
hwm = int(re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
print(f"PEAK rss={hwm} arrow={pa.default_memory_pool().max_memory()}", file=sys.stderr)
sys.exit(rc)
"""


def measured_prep(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, int, int]:
    done = subprocess.run([sys.executable, "-c", MEASURED, *args, "--no-progress"], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
    peak = done.stderr.rsplit("PEAK ", 1)[-1].split()
    return done, int(peak[0].split("=")[1]), int(peak[1].split("=")[1])


def huge_string(n: int) -> pa.Array:
    """One string value of n bytes of 'a', built on the bytes without a second copy."""
    offsets = pa.array([0, n], pa.int64()).buffers()[1]
    return pa.LargeStringArray.from_buffers(1, offsets, pa.py_buffer(b"a" * n))


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    """bomb.parquet: a first row group of one 256 MB value (zstd: a few kB on disk), then a normal row
    group; dict_bomb.parquet: one 1 MB dictionary value repeated in 2048 rows (2 GB decoded);
    good.parquet: the normal rows alone, and the peak memory of a run over it (the baseline)."""
    root = tmp_path_factory.mktemp("bombs")
    good = [f"normal parquet row {i} with some words." for i in range(40)]
    schema = pa.schema([("text", pa.large_string())])
    with pq.ParquetWriter(root / "bomb.parquet", schema, compression="zstd", compression_level=1,
                          use_dictionary=False, write_statistics=False) as w:  # statistics would copy 256 MB
        w.write_table(pa.table([huge_string(256 * MB)], schema=schema))
        w.write_table(pa.table({"text": pa.array(good, pa.large_string())}))
    pq.write_table(pa.table({"text": pa.DictionaryArray.from_arrays(pa.array([0] * 2048, pa.int32()),
                                                                      pa.array(["b" * MB]))}),
                   root / "dict_bomb.parquet", compression="zstd")
    sizes = {p.name: p.stat().st_size for p in root.iterdir()}
    assert max(sizes.values()) < MB, sizes  # small files that expand to gigabytes
    pq.write_table(pa.table({"text": good}), root / "good.parquet")
    done, rss, arrow = measured_prep(str(root / "good.parquet"), "--out", str(root / "baseline"), "--seq-len", "8")
    assert done.returncode == 0, done.stderr
    return root, good, rss, arrow


def test_a_parquet_page_bomb_is_skipped_unread_and_memory_stays_small(bombs, tmp_path):
    root, good, base_rss, base_arrow = bombs
    out = tmp_path / "out"
    done, rss, arrow = measured_prep(str(root / "bomb.parquet"), "--out", str(out), "--seq-len", "8",
                                     "--max-row-group-mb", "64")
    assert done.returncode == 0, done.stderr
    assert (f"skipped {root / 'bomb.parquet'}:1: Parquet row group too large (not read) (row group 0 (rows 1-1): "
            f"column 'text' decompresses to 256 MB, over --max-row-group-mb=64)") in done.stderr
    m = manifest(out)
    assert m["inputs"][0]["train"]["documents"] + m["inputs"][0]["val"]["documents"] == len(good)
    assert m["skipped"]["counts"] == {"Parquet row group too large (not read)": 1}
    assert arrow < base_arrow + 4 * MB, (arrow, base_arrow)  # the 256 MB page was never decompressed
    # nor copied anywhere else (the margin absorbs page-cache noise on a loaded machine; before the fix
    # this run peaked 770 MB above the baseline)
    assert rss < base_rss + 128 * MB, (rss, base_rss)


def test_a_repeated_dictionary_value_is_skipped_by_its_length_without_decoding(bombs, tmp_path):
    root, _, base_rss, base_arrow = bombs
    out = tmp_path / "out"
    done, rss, arrow = measured_prep(str(root / "dict_bomb.parquet"), "--out", str(out), "--seq-len", "8",
                                     "--max-doc-mb", "0.5")
    assert done.returncode == 1, done.stderr  # every row is over --max-doc-mb: nothing to write
    assert f"skipped {root / 'dict_bomb.parquet'}:1: document too large (over 524288 bytes)" in done.stderr
    assert "no valid document was read" in done.stderr
    assert arrow < base_arrow + 8 * MB, (arrow, base_arrow)  # one 1 MB dictionary value, never 2048 copies
    assert rss < base_rss + 128 * MB, (rss, base_rss)


def test_recursive_glob_through_links_to_parent_directories_ends(tmp_path):
    """Two links back up the tree: glob.glob(recursive=True) would branch twice per level until ELOOP
    (2^40 paths). `**` does not descend into links to directories; the file is read once."""
    sub = tmp_path / "in" / "sub"
    sub.mkdir(parents=True)
    (sub / "doc.jsonl").write_text(json.dumps({"text": "a document reached through a glob " * 4}) + "\n")
    (sub / "up").symlink_to("..")
    (sub / "self").symlink_to(".")
    out = tmp_path / "out"
    start = time.monotonic()
    done = prep(str(tmp_path / "in" / "**" / "*.jsonl"), "--out", str(out), "--seq-len", "8", timeout=60)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 60
    assert [i["path"] for i in manifest(out)["inputs"]] == [str(sub / "doc.jsonl")]


def test_a_second_run_into_the_same_out_is_refused_naming_the_lock(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("some text for one small dataset, long enough for samples. " * 4)
    out = tmp_path / "out"
    lock = lock_file(out)
    with open(lock, "w") as held:  # the first run, as this test stands in for it
        held.write("rgpt-prep pid 4242 on elsewhere\n")
        held.flush()
        fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = prep(str(tmp_path / "in"), "--out", str(out), "--seq-len", "8")
        assert done.returncode == 2, done.stderr
        assert (f"rgpt-prep: another rgpt-prep run is writing {out}: {lock} is locked by rgpt-prep pid 4242 on "
                f"elsewhere; wait for it to finish (or stop it) and run again") in done.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "in"]  # nothing written or taken over
    done = prep(str(tmp_path / "in"), "--out", str(out), "--seq-len", "8")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]  # the lock file went with the run
