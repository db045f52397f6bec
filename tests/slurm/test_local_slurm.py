"""When the SLURM tests may skip (tests/helpers/slurm.py): only when SLURM cannot be installed here and
they are not required (not root, no CI, no RGPT_REQUIRE_SLURM=1; or root with RGPT_OFFLINE=1); a
cluster that fails to start is a failure, never a skip (a root CI run must not pass with every SLURM
test skipped because a daemon did not come up)."""
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
    for var in ("RGPT_REQUIRE_SLURM", "CI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RGPT_OFFLINE", "1")  # a root machine declared offline: the one root case that may skip

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
    with pytest.raises(RuntimeError, match=r"required \(RGPT_REQUIRE_SLURM=1\) but .*no apt-get") as e:
        slurm.LocalSlurm.start(tmp_path)
    assert not isinstance(e.value, slurm.SlurmUnavailable)


@pytest.mark.parametrize("euid,env,must", [
    (0, {}, "running as root"),                          # CI's user: unavailability fails
    (0, {"RGPT_OFFLINE": "1"}, None),                    # root, declared offline: may skip
    (1000, {}, None),                                    # a developer's account: may skip
    (1000, {"CI": "true"}, "CI=true"),
    (0, {"CI": "1", "RGPT_OFFLINE": "1"}, "CI=1"),       # CI cannot opt out
    (1000, {"RGPT_REQUIRE_SLURM": "1"}, "RGPT_REQUIRE_SLURM=1"),
    (1000, {"CI": "false"}, None),
], ids=["root", "root-offline", "user", "ci", "ci-offline", "require", "ci-false"])
def test_unavailable_slurm_fails_where_the_tests_are_required(missing, monkeypatch, tmp_path, euid, env, must):
    monkeypatch.delenv("RGPT_OFFLINE")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(slurm.os, "geteuid", lambda: euid)
    monkeypatch.setattr(slurm.shutil, "which", lambda c: None)  # no apt-get (and, not root, no install)
    if must is None:
        with pytest.raises(slurm.SlurmUnavailable):
            slurm.LocalSlurm.start(tmp_path)
        return
    with pytest.raises(RuntimeError, match=f"SLURM tests are required \\({must}.*\\) but slurm-wlm") as e:
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
