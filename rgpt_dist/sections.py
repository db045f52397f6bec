"""Typed configuration machinery: dataclass <-> dict/YAML, `key=value` overrides, error collection.

No torch import here, in rgpt_dist.config or in the model configs (rgpt_dist.models.config and each
family's): configs are loaded and validated before any process group, model or tensor exists. The
lowest layer above the foundations (docs/architecture.md): the model configs build on it, and the
run's config (rgpt_dist.config) composes them.

Conventions:
- every section is a `@dataclass` subclass of `Section`, one attribute docstring per field;
- `Section.problems()` returns human-readable problems (never raises); the top-level config
  gathers the problems of all sections and raises one `ConfigError` listing every one of them;
- a section that has variants (model families) declares `variant_key` and `variants()`; the value
  of that key in the input dict selects the concrete dataclass.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
import os
import reprlib
import stat
import types
from pathlib import Path
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

import yaml


class ConfigError(ValueError):
    """A config could not be loaded or is invalid; the message lists every problem found."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("invalid config:\n  - " + "\n  - ".join(self.problems))


@dataclasses.dataclass
class Section:
    """Base class of every config section."""

    variant_key: ClassVar[str | None] = None

    @classmethod
    def variants(cls) -> dict[str, type["Section"]]:
        """Concrete dataclasses selectable by `variant_key` (only for sections with variants)."""
        return {}

    def problems(self, path: str) -> list[str]:
        """Problems of this section alone; `path` is its dotted name for messages."""
        return []

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxdict, _SHOW.maxlist, _SHOW.maxtuple, _SHOW.maxstring, _SHOW.maxother = 3, 8, 8, 8, 120, 120


def _show(value: Any) -> str:
    """repr(value) cut to a few hundred characters: a message must not print (or build) a huge
    value, e.g. a list that YAML aliases expand to thousands of entries."""
    return _SHOW.repr(value)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`; return it (ints widen to float). Raise ConfigError."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(f"{where}={_show(value)} has the wrong type (expected {_type_name(tp)})")
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{where}={_show(value)} is not one of {list(get_args(tp))}")
        return value
    if inspect.isclass(tp) and issubclass(tp, Section):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}={_show(value)} must be a mapping of {tp.__name__} fields")
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}={_show(value)} must be a list")
        (item_tp, *_) = get_args(tp) or (Any,)
        items = [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}={_show(value)} must be a mapping")
        return dict(value)
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }.get(tp)
    if ok is None:
        raise TypeError(f"unsupported config annotation {tp!r} at {where}")
    if tp is float and isinstance(value, str):  # PyYAML (YAML 1.1) reads 3e-4 as a string
        try:
            return float(value)
        except ValueError:
            pass
    if not ok(value):
        raise ConfigError(f"{where}={_show(value)} has the wrong type (expected {_type_name(tp)})")
    return float(value) if tp is float else value


def from_dict(cls: type[Section], data: dict[str, Any], path: str = "") -> Section:
    """Build `cls` from a plain dict: unknown keys and wrong types are errors naming the key."""
    if cls.variant_key is not None:
        options = cls.variants()
        chosen = data.get(cls.variant_key)
        if chosen not in options:
            where = f"{path}.{cls.variant_key}" if path else cls.variant_key
            raise ConfigError(f"{where}={chosen!r} is not one of {sorted(options)}")
        cls = options[chosen]
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    problems, kwargs = [], {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else key
        if key not in fields:
            problems.append(f"{where} is not a field of {cls.__name__} (fields: {', '.join(fields)})")
            continue
        try:
            kwargs[key] = _coerce(value, hints[key], where)
        except ConfigError as e:
            problems.extend(e.problems)
    if problems:
        raise ConfigError(problems)
    return cls(**kwargs)


def out_of_bounds(path: str, op: str, limit: float, **values: float) -> list[str]:
    """One message per value failing `value <op> limit` (op: '>', '>=', '<' or '<='), e.g.
    'train.lr=0.0 must be > 0'. A non-finite float (nan, inf) fails every bound: 'must be finite'."""
    ok = {">": lambda v: v > limit, ">=": lambda v: v >= limit, "<": lambda v: v < limit,
          "<=": lambda v: v <= limit}[op]
    out = []
    for k, v in values.items():
        if isinstance(v, float) and not math.isfinite(v):
            out.append(f"{path}.{k}={v!r} must be finite")
        elif not ok(v):
            out.append(f"{path}.{k}={v!r} must be {op} {limit}")
    return out


def nonfinite_fields(section: Section, path: str) -> list[str]:
    """'PATH.FIELD=nan must be finite' for every float field (nested sections included) holding
    nan or +-inf: no size, rate or scale of this project may be non-finite, bounded or not."""
    out = []
    for f in dataclasses.fields(section):
        value, where = getattr(section, f.name), f"{path}.{f.name}" if path else f.name
        if isinstance(value, Section):
            out += nonfinite_fields(value, where)
        elif isinstance(value, float) and not math.isfinite(value):
            out.append(f"{where}={value!r} must be finite")
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a','b','c'], value); the value is parsed as YAML (`4`, `0.1`, `true`, `[1,2]`)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = load_yaml(raw) if raw != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({e.problem})") from None
    return key.split("."), value


def literal_override(key: str, value: str | list[str]) -> str:
    """`key=value` for a value that must reach the config exactly as given (a path, a list of paths):
    written as JSON, which YAML reads back unchanged, so a `#` (a YAML comment), a `,` (a flow-list
    separator), spaces, quotes or `$` in a path stay part of that one path. Our own launchers pass
    every path this way; a user's key=value stays YAML, as documented."""
    return f"{key}={json.dumps(value)}"


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Merge `key=value` overrides into a nested dict (a copy); missing levels are created."""
    merged = yaml.safe_load(yaml.safe_dump(data))  # deep copy of plain data
    for text in overrides:
        keys, value = parse_override(text)
        node = merged
        for k in keys[:-1]:
            child = node.setdefault(k, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {k} is a value, not a section")
            node = child
        node[keys[-1]] = value
    return merged


MAX_CONFIG_BYTES = 16 << 20
"""A config file larger than this (16 MiB) is refused: configs are a few kilobytes, and the bound
keeps a device or endless file (/dev/zero) from being read whole."""


MAX_YAML_NODES = 100_000
"""A YAML document is refused when it expands to more nodes than this, each alias (`*name`) counted
as a full copy of what it names: configs have a few hundred nodes, while nested aliases ("billion
laughs") expand exponentially -- cheap to parse, but any walk over the values (type checks, error
messages, the deep copy of overrides) would build every copy. An alias inside its own anchor
(a recursive value) is refused too."""


def _children(node: Any) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_expansion(root: Any) -> None:
    """Raise yaml.composer.ComposerError when `root` expands beyond MAX_YAML_NODES or refers to
    itself. Sizes are memoised per node (an alias shares its anchor's node), so this costs one pass
    over the composed graph, however large its expansion; iterative, so deep nesting cannot
    overflow the stack here."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # nodes whose subtree is being sized: the current path
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            open_nodes.discard(id(node))
            sizes[id(node)] = size = 1 + sum(sizes[id(c)] for c in _children(node))
            if size > MAX_YAML_NODES:
                raise yaml.composer.ComposerError(
                    None, None, f"the value starting here expands to more than {MAX_YAML_NODES} nodes "
                    f"through aliases (*name): refusing to load it", node.start_mark)
            continue
        if id(node) in sizes:
            continue
        open_nodes.add(id(node))
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise yaml.composer.ComposerError(
                    None, None, "an alias refers to the value that contains it (a recursive value)",
                    child.start_mark)
            if id(child) not in sizes:
                stack.append((child, False))


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key repeated in one mapping is an error (YAML keeps the last
    value silently, so a duplicated section would drop the first one's settings unseen) and a
    document's alias expansion is bounded before any value is built (MAX_YAML_NODES)."""

    def compose_document(self):
        node = super().compose_document()
        _check_expansion(node)  # before any value is built (see MAX_YAML_NODES)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                seen[key] = line
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} on line {line} (first on line {first}): YAML "
                        f"would keep only the last one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """yaml.safe_load with duplicate keys refused (at any level) and aliases bounded (MAX_YAML_NODES);
    raises yaml.YAMLError."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)


def _read_text(path: Path) -> str:
    """The file's text; every way of not being a readable UTF-8 text file is a ConfigError naming it."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device never end
            kind = "a directory" if path.is_dir() else "not a regular file"
            raise ConfigError(f"config file {path} is {kind}, not a YAML file")
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES >> 20} MiB: not a config")
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigError(f"config file {path} is binary (a NUL byte at offset {nul}), not YAML")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"config file {path} is not UTF-8 text (line {line}, byte {e.start}: "
                          f"{data[e.start:e.start + 1]!r})") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file holding one mapping; errors name the file (and the line, where YAML gives one)."""
    path = Path(path)
    text = _read_text(path)
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping, not {type(data).__name__}")
    return data


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (and its bases), for `--describe` style help."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(inspect.getsource(klass).lstrip())
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


__all__ = ["ConfigError", "Section", "from_dict", "out_of_bounds", "nonfinite_fields", "parse_override",
           "apply_overrides", "load_yaml", "read_yaml", "field_docs"]
