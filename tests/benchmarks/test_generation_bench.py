"""Smoke test: the generation benchmark runs end to end with --quick (eager only, a few seconds) and
prints its tables; timings are not asserted (see docs/performance.md), the memory accounting is."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generation_quick_runs_and_reports_tables():
    out = subprocess.run([sys.executable, "benchmarks/generation.py", "--quick"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
    for needle in ("## 1a. Generation latency", "| recurrent, average |", "| recurrent, no cache |",
                   "Eager target latency(recurrent) / latency(dense) <= 1.10", "## 1b. Memory",
                   "torch MemTracker", "## 2. Decoding memory", "malloc keeps freed memory", "1 thread(s)"):
        assert needle in out
    assert "MISMATCH" not in out  # live caches == kv_cache_bytes; param_count == instantiated parameters
    # Table 4 of the paper, from the analytic sizes: full cache 0.55x dense at B=1, 0.91x at B=32; average 0.39x
    assert "| full | 171.1M | 326 | 96 | 422 (0.55x) | 3,072 | 3,398 (0.91x) |" in out
    assert "| average | 171.1M | 326 | 36 | 362 (0.47x) | 1,152 | 1,478 (0.39x) |" in out
