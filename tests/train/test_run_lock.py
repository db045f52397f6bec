"""A second training process on the same run directory is refused, naming the holder."""
import subprocess
import sys

import pytest

from rgpt_dist.train.run_lock import RunDirBusy, lock_run_dir

HOLD = "from rgpt_dist.train.run_lock import lock_run_dir; import sys, time; lock_run_dir(sys.argv[1]); print('held', flush=True); time.sleep(60)"


def test_second_process_is_refused_until_the_first_exits(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirBusy, match=f"pid {holder.pid} on"):
            lock_run_dir(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    lock_run_dir(tmp_path)  # released with the process
    assert str(__import__("os").getpid()) in (tmp_path / ".lock").read_text()
