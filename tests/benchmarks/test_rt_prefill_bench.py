"""Smoke test: the RT prefill benchmark runs end to end with --quick and prints its table; timings are
not asserted (see the numbers of a full run in docs), the key-read counts are."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The script re-executes itself with these malloc settings (a second torch import); set, they skip it.
KEEP_FREED = {"MALLOC_MMAP_THRESHOLD_": str(2**35), "MALLOC_TRIM_THRESHOLD_": str(2**36),
              "MALLOC_TOP_PAD_": str(2**30)}


def test_rt_prefill_quick_runs_and_reports_ratios():
    out = subprocess.run([sys.executable, "benchmarks/rt_prefill.py", "--quick", "--no-backward"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, **KEEP_FREED}).stdout
    for needle in ("1 thread(s)", "malloc keeps freed memory", "fwd naive / tiled", "| RT layer | 32 |",
                   "| attention only | 16 |"):
        assert needle in out
    # key reads: naive N (N - 1) / 2, tiled sum_{t<N} lowbit(t) = (N/2) log2 N
    assert "| RT layer | 32 | 496 (0) | 80 (0.0) | 6.2 |" in out
    assert "N=16: tiled key reads 32 == sum_(t<N) lowbit(t) = 32" in out and "MISMATCH" not in out


def test_rt_prefill_bad_argument_exits_2():
    run = subprocess.run([sys.executable, "benchmarks/rt_prefill.py", "--rounds", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--rounds=0 must be" in run.stderr and "Traceback" not in run.stderr
