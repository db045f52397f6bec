"""The package's layers (docs/architecture.md), held by import-linter's contracts in .importlinter:
imports run down the layers, and no package's modules import each other in a cycle. Each contract
is also shown to fail: the same check on a copy of the sources with one wrong import added."""
import ast
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


def _function_imports() -> list[tuple[str, int, bool]]:
    """(file, line, whether a comment beside it or on the line above gives a reason) for every import
    inside a function of the three packages."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = path.read_text().splitlines()
            for func in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(func):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        here, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
                        found.append((f"{path.relative_to(ROOT)}", node.lineno, "#" in here or above.startswith("#")))
    return sorted(set(found))


def test_few_imports_inside_functions_each_with_its_reason():
    """docs/architecture.md: under 20 imports inside functions, each saying why; no sys.path edits."""
    found = _function_imports()
    assert len(found) < 20, "\n".join(f"{f}:{n}" for f, n, _ in found)
    assert all(reason for *_, reason in found), [f"{f}:{n}" for f, n, reason in found if not reason]
    edits = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "sys.path.insert" in p.read_text()
             or "sys.path.append" in p.read_text()]
    assert not edits, edits
