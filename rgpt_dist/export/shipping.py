"""The native model code a Hugging Face export ships, so that the export runs the very modules the
trainer runs (no second copy of the maths): the family's model module and every rgpt_dist module it
imports, copied verbatim except their `from rgpt_dist... import` statements, which become relative
imports of the flat export directory (transformers' remote code is one folder):

    rgpt_dist.models.layers          -> layers.py
    rgpt_dist.models.poisson.model   -> poisson_model.py
    rgpt_dist.noise                  -> noise.py
    the family's config class        -> RGPTConfig of configuration_rgpt.py (the HF config carries
                                        the same fields), imported under the config class's name

The entry module (modeling_rgpt.py) gets one import per shipped module appended, the model class
among them as `NativeModel`: for a local directory transformers copies only the files its entry
module imports, and it re-executes the entry module (not the others) when an export with the same
directory name but other code is loaded in the same process, so the class must be bound there. Any
other rgpt_dist import is refused: a shipped module must not need the package.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

PACKAGE = "rgpt_dist"
HF_CONFIG = "from .configuration_rgpt import RGPTConfig as {name}"


def flat_name(module: str) -> str:
    """'rgpt_dist.models.poisson.model' -> 'poisson_model'; 'rgpt_dist.noise' -> 'noise'."""
    parts = module.split(".")[1:]
    return "_".join(parts[1:] if parts[0] == "models" else parts)


def _imports(source: str) -> list[ast.ImportFrom | ast.Import]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.ImportFrom, ast.Import))]


def _rewrite(module: str, source: str, config_module: str) -> tuple[str, list[str]]:
    """(the shipped source, the rgpt_dist modules it imports); only import statements change."""
    lines = source.splitlines(keepends=True)
    needed, edits = [], []
    for node in _imports(source):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if any(n.split(".")[0] == PACKAGE for n in names) or (isinstance(node, ast.ImportFrom) and node.level):
            raise ValueError(f"{module}: `import rgpt_dist...` and relative imports cannot be shipped; "
                             f"use `from rgpt_dist.<module> import <name>`")
        if not isinstance(node, ast.ImportFrom) or (node.module or "").split(".")[0] != PACKAGE:
            continue
        indent = lines[node.lineno - 1][:node.col_offset]
        if node.module == config_module:
            text = "\n".join(indent + HF_CONFIG.format(name=a.asname or a.name) for a in node.names)
        else:
            needed.append(node.module)
            aliases = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
            text = f"{indent}from .{flat_name(node.module)} import {aliases}"
        edits.append((node.lineno, node.end_lineno, text + "\n"))
    for first, last, text in sorted(edits, reverse=True):
        lines[first - 1:last] = [text]
    return "".join(lines), needed


def shipped_sources(model: str, config_class: type) -> dict[str, str]:
    """'module:Class' of a native model -> {file name: shipped source}."""
    module_name, cls = model.split(":")
    out, todo, seen = {}, [module_name], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = Path(importlib.import_module(name).__file__)
        source, needed = _rewrite(name, path.read_text(), config_class.__module__)
        file = f"{flat_name(name)}.py"
        if file in out:
            raise ValueError(f"two shipped modules flatten to {file}")
        out[file] = source
        todo += needed
    return out


def ship(model: str, config_class: type, out_dir: Path, entry: str = "modeling_rgpt.py") -> list[str]:
    """Writes the shipped modules into out_dir and appends an import of each to `entry` (transformers
    copies a local model's files by following its entry module's imports only); returns their names."""
    files = shipped_sources(model, config_class)
    for name, source in files.items():
        (Path(out_dir) / name).write_text(source)
    module, cls = model.split(":")
    with open(Path(out_dir) / entry, "a") as f:
        f.write(f"from .{flat_name(module)} import {cls} as NativeModel  # noqa: E402, F811\n")
        for name in sorted(files):
            f.write(f"from .{name[:-3]} import __doc__ as _shipped_{name[:-3]}  # noqa: E402, F401\n")
    return sorted(files)
