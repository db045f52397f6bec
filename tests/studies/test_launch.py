"""A study launches its runs through the training launcher's module (`-m launcher.train`), never a
script path, from the checkout, whatever directory the study was started in; each run's commands run
in sequence, its output in its own log."""
import subprocess
import sys

from rgpt_dist.studies import launch


def test_the_train_command_runs_the_launcher_module():
    cmd = launch.train_command("configs/experiments/quickstart.yaml", ["train.max_steps=1"], nproc=2)
    assert cmd[:4] == [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    assert cmd[4:] == ["--nproc_per_node=2", "-m", "launcher.train", "configs/experiments/quickstart.yaml",
                       "train.max_steps=1"]
    assert not any(part.endswith(".py") for part in cmd)


def test_the_module_is_found_from_another_directory_and_configs_from_the_checkout(tmp_path):
    """The run's environment and working directory (run_all): `launcher.train --help` answers, and
    a study's config path resolves, from a directory that holds neither."""
    env = {"PYTHONPATH": str(launch.ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "launcher.train", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Train a model from an experiment config" in done.stdout
    assert (launch.ROOT / "configs" / "experiments" / "quickstart.yaml").is_file()


def test_a_failed_run_is_reported_and_the_others_still_run(tmp_path, capsys):
    """Real processes: the first run's second command fails with a message (its third never runs),
    every run's commands run in order with the checkout as working directory and PYTHONPATH, each
    run's output goes to its own log, and the failed run's tail is printed."""
    class Run:
        def __init__(self, name):
            self.name = name

    def commands(run):
        say = "import os, sys; print(sys.argv[1], os.getcwd() + '|' + os.environ['PYTHONPATH'])"
        fail = "import sys; sys.stderr.write('boom'); sys.exit(3)" if run.name == "a" else "pass"
        return [[sys.executable, "-c", say, f"{run.name}-1"], [sys.executable, "-c", fail],
                [sys.executable, "-c", say, f"{run.name}-3"]]

    for jobs in (1, 2):
        logs = tmp_path / f"logs{jobs}"
        assert launch.run_all([Run("a"), Run("b"), Run("c")], commands, jobs=jobs, log_dir=logs) == ["a"]
        root = f"{launch.ROOT}|{launch.ROOT}"
        assert (logs / "a.log").read_text() == f"a-1 {root}\nboom"
        for name in "bc":
            assert (logs / f"{name}.log").read_text() == f"{name}-1 {root}\n{name}-3 {root}\n"
        out = capsys.readouterr()
        assert "a: FAILED (3)" in out.out and "b: done" in out.out and "c: done" in out.out
        assert out.err.count("boom") == 1


def test_a_lane_freed_by_a_short_run_starts_the_next_at_once(tmp_path):
    """Two lanes, run a long and b, c short: c starts when b ends, while a still runs (a waits for
    c's mark, so a scheduler that waits for the oldest run first would make a time out); b's end is
    reported first, as it happens, not after a's."""
    class Run:
        def __init__(self, name):
            self.name = name

    mark = tmp_path / "c-ran"
    wait = (f"import pathlib, sys, time; end = time.monotonic() + 60\n"
            f"while not pathlib.Path({str(mark)!r}).exists():\n"
            f"    time.sleep(0.05)\n    if time.monotonic() > end: sys.exit('c never started')")

    def commands(run):
        if run.name == "a":
            return [[sys.executable, "-c", wait]]
        if run.name == "c":
            return [["touch", str(mark)]]
        return [["true"]]

    ended = []
    failed = launch.run_all([Run("a"), Run("b"), Run("c")], commands, jobs=2, log_dir=tmp_path / "logs",
                            on_end=lambda run, wall_s, code: ended.append((run.name, code)))
    assert failed == [] and ended[0] == ("b", 0) and sorted(ended[1:]) == [("a", 0), ("c", 0)]


def test_an_interrupted_study_stops_its_runs_and_their_children(tmp_path):
    """Ctrl-C (or SIGTERM, which `rgpt study` turns into an exit) while runs train: every running
    run's process group is terminated, a grandchild (torchrun's ranks) included, and nothing waits."""
    import os
    import signal
    import threading
    import time

    class Run:
        def __init__(self, name):
            self.name = name

    pids = tmp_path / "pids"
    child = f"import os, time; open({str(pids)!r} + os.environ['N'], 'w').write(str(os.getpid())); time.sleep(120)"

    def commands(run):  # the shell runs python, which runs a grandchild: as torchrun runs its ranks
        return [["env", f"N={run.name}", sys.executable, "-c",
                 f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"]]

    def interrupt_once_both_run():  # Ctrl-C once both grandchildren have started, however slow the host
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(_written(tmp_path / f"pids{n}") for n in "ab"):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    # Python's own Ctrl-C handler for the test: an in-process training run earlier in the session may
    # have left SIGINT ignored (the trainer's preemption handling)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_once_both_run, daemon=True).start()
    start = time.perf_counter()
    try:
        launch.run_all([Run("a"), Run("b"), Run("c")], commands, jobs=2, log_dir=tmp_path / "logs")
        raise AssertionError("not interrupted")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.perf_counter() - start < 90
    started = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("pids"))
    assert started == ["pidsa", "pidsb"]  # two at a time; c never started
    for name in started:
        pid = int((tmp_path / name).read_text())
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"grandchild {pid} of run {name[-1]} still runs")


def _written(path) -> bool:
    return path.is_file() and path.read_text() != ""
