"""The package's layers (docs/architecture.md), held by import-linter's contracts in .importlinter:
imports run down the layers, and no package's modules import each other in a cycle. Each contract
is also shown to fail: the same check on a copy of the sources with one wrong import added."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.dist import ROOT

PACKAGES = ("rgpt_dist", "launcher", "data_prep")


def lint(where: Path) -> subprocess.CompletedProcess:
    """lint-imports with the repository's contracts on the packages found first from `where`."""
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(exe), str(ROOT / ".importlinter"), "--no-cache", "--no-logo"], cwd=where,
                          env={"PATH": str(exe.parent), "PYTHONPATH": str(where)}, capture_output=True,
                          text=True, timeout=300)


def test_the_imports_keep_the_layers():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in done.stdout, done.stdout[-2000:]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A copy of the three packages' Python sources."""
    root = tmp_path_factory.mktemp("src")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


@pytest.mark.parametrize("victim,line,broken", [
    # a model importing the trainer: upward across five layers (and a cycle: train imports models)
    ("rgpt_dist/models/layers.py", "from rgpt_dist.train import trainer", "rgpt_dist.models is not allowed to import rgpt_dist.train"),
    # the data index importing the shard checks, which import it: a cycle inside rgpt_dist.data
    ("rgpt_dist/data/index.py", "from rgpt_dist.data import verify", "No cycles are allowed in rgpt_dist.data"),
])
def test_a_wrong_import_breaks_a_contract(sources, tmp_path, victim, line, broken):
    copy = tmp_path / "src"
    shutil.copytree(sources, copy)
    path = copy / victim
    path.write_text(path.read_text() + f"\n{line}  # deliberately wrong\n")
    done = lint(copy)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert "BROKEN" in done.stdout and broken in done.stdout, done.stdout[-3000:]
