"""benchmarks/remote_stream.py's smoke run (seq_len 32), in its own process: the dataset goes to
moto's S3 server through rgpt-prep, and every pass (local, cold cache, warm cache) reads every
training sample (the bar's outcome is a timing, which unit tests do not judge: docs/performance.md
has the measured runs)."""
import os
import re
import subprocess
import sys

from tests.helpers.dist import ROOT


def test_remote_stream_quick_reads_every_sample_in_each_pass(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "benchmarks/remote_stream.py", "--quick", "--dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: the bar missed, a timing
    rows = re.findall(r"^\| (local|s3, cold cache|s3, warm cache) \| ([\d,]+) \|", done.stdout, re.M)
    assert [name for name, _ in rows] == ["local", "s3, cold cache", "s3, warm cache"], done.stdout
    assert len({n for _, n in rows}) == 1 and int(rows[0][1].replace(",", "")) > 8000, done.stdout  # 8,718 samples
    assert re.search(r"^bar: warm cache >= 0.8x local: (met|MISSED)$", done.stdout, re.M)
    assert not any(tmp_path.iterdir())  # nothing left behind
