"""benchmarks/checkpoint_io.py's smoke run on a tiny model, in its own process (it initialises
torch.distributed): the engine the trainer builds saves, verifies, loads and converts, and the table
holds its row with the ratios the bar reads (the bar's outcome is a timing, which unit tests do not
judge: docs/performance.md has the measured runs)."""
import os
import re
import subprocess
import sys

from tests.helpers.dist import ROOT


def test_checkpoint_io_quick_saves_loads_converts_and_prints_its_row(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "benchmarks/checkpoint_io.py", "--quick", "--dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: the bar missed, a timing
    row = re.search(r"^\| tiny \| ([\d,]+) \| ([\d,]+) \|" + r" ([\d,]+) \|" * 5 + r" ([\d.]+) \| ([\d.]+) \| "
                    r"([\d.]+) \(([\d.]+)x\) \|$", done.stdout, re.M)
    assert row, done.stdout
    assert int(row.group(1).replace(",", "")) > 1e6 and int(row.group(2).replace(",", "")) > 10  # params, MB
    assert re.search(r"^bar: save and load >= 0.5x \(plain I/O \+ one sha256 pass\): (met|MISSED)$", done.stdout, re.M)
    assert not any(tmp_path.iterdir())  # nothing left behind
