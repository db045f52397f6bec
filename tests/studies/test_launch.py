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
    """Real processes (a stand-in for torchrun): the first fails with a message on stderr, every run
    gets its own overrides, the checkout as working directory and PYTHONPATH, in order."""
    calls = []

    def fake_command(config, overrides, nproc):
        calls.append((config, overrides, nproc))
        code = "import os, sys; sys.stderr.write(os.getcwd() + '|' + os.environ['PYTHONPATH'] + ' boom'); "
        return [sys.executable, "-c", code + f"sys.exit({1 if len(calls) == 1 else 0})"]

    class Run:
        def __init__(self, name):
            self.name, self.config = name, f"configs/experiments/{name}.yaml"

    monkeypatch.setattr(launch, "train_command", fake_command)
    for jobs in (1, 2):
        calls.clear()
        assert launch.train_runs([Run("a"), Run("b"), Run("c")], lambda run: [f"log.run_dir=runs/{run.name}"],
                                 nproc=1, jobs=jobs) == ["a"]
        assert calls == [(f"configs/experiments/{n}.yaml", [f"log.run_dir=runs/{n}"], 1) for n in "abc"]
        out = capsys.readouterr()
        assert "a: FAILED (1)" in out.out and "b: done" in out.out and "c: done" in out.out
        assert out.err.count("boom") == 1 and f"{launch.ROOT}|{launch.ROOT} boom" in out.err  # the failed run's
