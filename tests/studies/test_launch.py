"""A study launches its runs through the training launcher's module (`-m launcher.train`), never a
script path, from the checkout, whatever directory the study was started in."""
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
    """The run's environment and working directory (train_runs): `launcher.train --help` answers, and
    a study's config path resolves, from a directory that holds neither."""
    env = {"PYTHONPATH": str(launch.ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "launcher.train", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Train a model from an experiment config" in done.stdout
    assert (launch.ROOT / "configs" / "experiments" / "quickstart.yaml").is_file()


def test_a_failed_run_is_reported_and_the_others_still_run(monkeypatch, capsys):
    calls = []

    def fake_run(cmd, cwd, env, capture_output, text):
        calls.append((cmd, cwd, env["PYTHONPATH"]))
        return subprocess.CompletedProcess(cmd, 1 if len(calls) == 1 else 0, "", "boom")

    class Run:
        def __init__(self, name):
            self.name, self.config = name, f"configs/experiments/{name}.yaml"

    monkeypatch.setattr(launch.subprocess, "run", fake_run)
    assert launch.train_runs([Run("a"), Run("b")], lambda run: [f"log.run_dir=runs/{run.name}"], nproc=1) == ["a"]
    assert [c[0][-2:] for c in calls] == [["configs/experiments/a.yaml", "log.run_dir=runs/a"],
                                          ["configs/experiments/b.yaml", "log.run_dir=runs/b"]]
    assert all(cwd == launch.ROOT and path == str(launch.ROOT) for _, cwd, path in calls)
    out = capsys.readouterr()
    assert "a: FAILED (1)" in out.out and "b: done" in out.out and "boom" in out.err
