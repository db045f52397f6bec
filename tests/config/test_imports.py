"""The config package and the family registry (rgpt_dist.models.spec) import each other's names at
module level, never through imports deferred into functions (a sign of a cycle worked around)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _deferred_imports(path: Path, prefixes: tuple[str, ...]) -> list[str]:
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and id(node) not in top and (node.module or "").startswith(prefixes):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}")
    return out


def test_config_and_the_registry_do_not_defer_imports_of_each_other():
    config = sorted((ROOT / "rgpt_dist" / "config").glob("*.py"))
    found = [hit for p in config for hit in _deferred_imports(p, ("rgpt_dist.models", "rgpt_dist.config"))]
    found += _deferred_imports(ROOT / "rgpt_dist" / "models" / "spec.py", ("rgpt_dist.config",))
    assert found == []


def test_the_registry_imports_neither_torch_nor_config():
    tree = ast.parse((ROOT / "rgpt_dist" / "models" / "spec.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {n for n in names if n.startswith(("torch", "rgpt_dist.config"))}
