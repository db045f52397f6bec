"""Smoke test: the benchmark script runs end to end and prints its ratios (timings are not asserted;
speed is measured by running the script, see docs/performance.md)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_model_throughput_quick_runs_and_reports_ratios():
    out = subprocess.run([sys.executable, "benchmarks/model_throughput.py", "--quick", "--steps", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    for needle in ("matmul peak", "Eq.1 FLOPs ratio", "FLOP-normalised ratio", "malloc keeps freed memory"):
        assert needle in out
    for family in ("recurrent_gpt", "poisson", "relaxed"):  # every looped family against dense
        assert f"time({family})/time(dense)" in out
