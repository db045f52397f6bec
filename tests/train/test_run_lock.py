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
            lock_run_dir(tmp_path, wait_s=0.5)
    finally:
        holder.kill()
        holder.wait()
    lock_run_dir(tmp_path)  # released with the process
    assert str(__import__("os").getpid()) in (tmp_path / ".lock").read_text()


def test_a_forked_child_does_not_keep_the_directory_locked(tmp_path):
    """A helper process forked by the holder (and outliving it) must not hold the lock: POSIX record
    locks belong to the process that took them."""
    script = ("import os, sys, time; from rgpt_dist.train.run_lock import lock_run_dir; lock_run_dir(sys.argv[1]);"
              "pid = os.fork()\nif pid == 0:\n    os.close(1); os.close(2); time.sleep(30); os._exit(0)\nprint(pid, flush=True)")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    child = int(done.stdout.strip())
    try:
        lock_run_dir(tmp_path, wait_s=2)  # the holder exited; its forked child is still alive
    finally:
        __import__("os").kill(child, 9)


def test_the_train_cli_exits_2_naming_the_holder_of_a_locked_run_directory(dataset, tmp_path, monkeypatch, capsys):
    """docs/training.md: a second run in a directory in use exits with status 2 naming the holder,
    before any process group or model exists (training itself is replaced here: reaching it fails)."""
    import functools

    import launcher.train
    import rgpt_dist.train.run
    import rgpt_dist.train.run_lock as run_lock

    from tests.helpers.runs import COMMON

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setattr(run_lock, "lock_run_dir", functools.partial(run_lock.lock_run_dir, wait_s=0.5))
    monkeypatch.setattr(rgpt_dist.train.run, "train", lambda cfg: pytest.fail("trained in a locked run directory"))
    monkeypatch.delenv("RANK", raising=False)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        status = launcher.train.main(["configs/experiments/quickstart.yaml", *COMMON, f"data.paths=[{dataset}]",
                                      f"log.run_dir={run_dir}"])
    finally:
        holder.kill()
        holder.wait()
    assert status == 2
    err = capsys.readouterr().err
    assert f"train: {run_dir} is being trained by pid {holder.pid} on " in err, err
    assert "give this run another log.run_dir" in err and "Traceback" not in err
