"""When the SLURM tests may skip (tests/helpers/slurm.py): only when SLURM cannot be installed here;
a cluster that fails to start is a failure, never a skip (a root CI run must not pass with every
SLURM test skipped because a daemon did not come up)."""
import subprocess

import pytest

from tests.helpers import slurm


def _done(rc=0, stdout="", stderr=""):
    return subprocess.CompletedProcess([], rc, stdout, stderr)


@pytest.fixture
def missing(monkeypatch):
    """SLURM not installed; apt-get present; commands recorded and answered by `answers`."""
    calls, answers = [], {}
    monkeypatch.setattr(slurm, "_installed", lambda: False)
    monkeypatch.setattr(slurm.shutil, "which", lambda c: f"/usr/bin/{c}")
    monkeypatch.setattr(slurm.os, "geteuid", lambda: 0)
    monkeypatch.delenv("RGPT_REQUIRE_SLURM", raising=False)

    def run(cmd, **kwargs):
        calls.append(cmd)
        for prefix, answer in answers.items():
            if " ".join(cmd).startswith(prefix):
                return answer
        return _done()
    monkeypatch.setattr(slurm, "_run", run)
    return calls, answers


def test_skip_reasons_are_not_root_no_apt_and_no_package(missing, monkeypatch, tmp_path):
    calls, answers = missing
    answers["apt-cache policy"] = _done(stdout="slurmd:\n  Installed: (none)\n  Candidate: (none)\n")
    with pytest.raises(slurm.SlurmUnavailable, match="no apt source offers slurmctld slurmd slurm-client munge"):
        slurm.LocalSlurm.start(tmp_path)
    assert ["apt-get", "update", "-qq"] in calls  # the lists were refreshed before deciding
    monkeypatch.setattr(slurm.os, "geteuid", lambda: 1000)
    with pytest.raises(slurm.SlurmUnavailable, match="needs root"):
        slurm.LocalSlurm.start(tmp_path)
    monkeypatch.setattr(slurm.os, "geteuid", lambda: 0)
    monkeypatch.setattr(slurm.shutil, "which", lambda c: None)
    with pytest.raises(slurm.SlurmUnavailable, match="no apt-get"):
        slurm.LocalSlurm.start(tmp_path)
    monkeypatch.setenv("RGPT_REQUIRE_SLURM", "1")  # CI that must run the SLURM tests
    with pytest.raises(RuntimeError, match="RGPT_REQUIRE_SLURM=1 but") as e:
        slurm.LocalSlurm.start(tmp_path)
    assert not isinstance(e.value, slurm.SlurmUnavailable)


def test_an_offered_package_that_fails_to_install_is_a_failure(missing, tmp_path):
    calls, answers = missing
    answers["apt-cache policy"] = _done(stdout="  Installed: (none)\n  Candidate: 23.11.4-1\n")
    answers["apt-get install"] = _done(100, stderr="E: Sub-process /usr/bin/dpkg returned an error code (1)")
    with pytest.raises(RuntimeError, match="apt-get install .* failed") as e:
        slurm.LocalSlurm.start(tmp_path)
    assert not isinstance(e.value, slurm.SlurmUnavailable)
    answers["apt-get install"] = _done(100, stderr="E: Failed to fetch http://deb.debian.org/... Temporary failure")
    with pytest.raises(slurm.SlurmUnavailable, match="apt cannot download it"):  # offline: nothing to install
        slurm.LocalSlurm.start(tmp_path)


def test_a_daemon_that_does_not_start_is_a_failure(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm, "unavailable", lambda: None)
    monkeypatch.setattr(slurm, "install", lambda: None)
    monkeypatch.setattr(slurm, "_fake_gpus", lambda workdir: "")
    monkeypatch.setattr(slurm.LocalSlurm, "_start_munge", lambda self: None)
    monkeypatch.setattr(slurm, "_run", lambda cmd, **kw: _done(1, stderr="slurmctld: fatal: bad config"))
    with pytest.raises(RuntimeError, match="slurmctld failed to start: slurmctld: fatal") as e:
        slurm.LocalSlurm.start(tmp_path)
    assert not isinstance(e.value, slurm.SlurmUnavailable)
