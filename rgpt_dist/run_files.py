"""The one reader for the JSON and YAML files of a run directory (config.yaml, algo_run.json,
best.json, eval.json, frontier.json, record.json): a run may come from another user, and its files
are data, never trusted.

A file is read only when it is a regular file (a link is not followed, a FIFO or device is not
opened for use, so nothing blocks: rgpt_dist.durable.open_regular), up to a size cap; JSON without
NaN or infinities and nested at most MAX_DEPTH deep; YAML through the configs' bounded loader (alias
expansion capped: rgpt_dist.sections.load_yaml). Then `Fields` checks the mapping's fields one by one
against a file's schema. Every refusal is a RunFileError naming the file and, where one is at fault,
the field.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable

import yaml

from rgpt_dist.durable import UnsafePath, open_regular
from rgpt_dist.sections import ConfigError, load_yaml

MAX_BYTES = 16 * 2**20
"""The largest run file read (eval.json of a whole test grid is ~100 KB; a config ~10 KB)."""
MAX_DEPTH = 32
"""The deepest nesting of lists and mappings in a run file."""
TAG = re.compile(r"step_[0-9]{8}")
"""A checkpoint tag the trainer writes: step_ and eight digits."""


class RunFileError(ValueError):
    """A run file that cannot be used: unreadable, not a regular file, too large, malformed, or a
    field of the wrong type or out of range. The message names the file (and the field)."""


def read_bytes(path: str | Path, limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except UnsafePath as e:
        raise RunFileError(str(e)) from None
    except FileNotFoundError:
        raise RunFileError(f"{path} does not exist") from None
    except OSError as e:
        raise RunFileError(f"{path} cannot be read: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RunFileError(f"{path} is larger than {limit:,} bytes: not a run file")
    return data


def _text(path: str | Path, limit: int) -> str:
    try:
        return read_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise RunFileError(f"{path} is not UTF-8 text") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _depth(value: Any, limit: int) -> bool:
    """Whether `value` nests lists and mappings at most `limit` deep (iteratively: no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > limit:
                return False
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return True


def read_json(path: str | Path, limit: int = MAX_BYTES) -> Any:
    """The JSON value of a run file: strict JSON (no NaN or Infinity), nested at most MAX_DEPTH deep."""
    text = _text(path, limit)
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise RunFileError(f"{path} is nested more than {MAX_DEPTH} deep") from None
    except ValueError as e:
        raise RunFileError(f"{path} is not valid JSON: {e}") from None
    if not _depth(value, MAX_DEPTH):
        raise RunFileError(f"{path} is nested more than {MAX_DEPTH} deep")
    return value


def read_yaml(path: str | Path, limit: int = MAX_BYTES) -> Any:
    """The YAML value of a run file, through the configs' loader (aliases bounded, safe types only)."""
    text = _text(path, limit)
    try:
        value = load_yaml(text)
    except (yaml.YAMLError, ConfigError) as e:
        raise RunFileError(f"{path} is not valid YAML: {e}") from None
    except RecursionError:
        raise RunFileError(f"{path} is nested more than {MAX_DEPTH} deep") from None
    if not _depth(value, MAX_DEPTH):
        raise RunFileError(f"{path} is nested more than {MAX_DEPTH} deep")
    return value


def read_mapping(path: str | Path, kind: str = "json", limit: int = MAX_BYTES) -> "Fields":
    """A run file that must hold one mapping, as Fields to check (kind: json or yaml)."""
    value = (read_json if kind == "json" else read_yaml)(path, limit)
    if not isinstance(value, dict):
        raise RunFileError(f"{path} must hold a mapping, not {type(value).__name__}")
    return Fields(path, value)


class Fields:
    """A mapping read from `path`, its fields taken one by one with their types checked:

        f = read_mapping(run / "algo_run.json")
        seed = f.int("seed", lo=0)          # RunFileError naming the file and `seed` otherwise
        model = f.str("model", pattern=NAME, optional=True)
    """

    def __init__(self, path: str | Path, data: dict, prefix: str = ""):
        self.path, self.data, self.prefix = path, data, prefix

    def fail(self, name: str, why: str) -> RunFileError:
        return RunFileError(f"{self.path}: {self.prefix}{name} {why}")

    def _get(self, name: str, optional: bool) -> Any:
        if name not in self.data:
            if optional:
                return None
            raise self.fail(name, "is missing")
        return self.data[name]

    def str(self, name: str, *, optional: bool = False, pattern: re.Pattern | None = None,
            max_len: int = 1000, choices: tuple | None = None) -> Any:
        v = self._get(name, optional)
        if v is None and optional:
            return None
        if not isinstance(v, str):
            raise self.fail(name, f"must be a string, not {type(v).__name__}")
        if len(v) > max_len or (pattern is not None and not pattern.fullmatch(v)):
            raise self.fail(name, f"= {v[:80]!r} is not a valid value here")
        if choices is not None and v not in choices:
            raise self.fail(name, f"= {v!r} is not one of {', '.join(map(str, choices))}")
        return v

    def int(self, name: str, *, optional: bool = False, lo: int | None = None, hi: int | None = None) -> Any:
        v = self._get(name, optional)
        if v is None and optional:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(name, f"must be an integer, not {type(v).__name__}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise self.fail(name, f"= {v} is outside {lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}")
        return v

    def number(self, name: str, *, optional: bool = False, lo: float = -math.inf, hi: float = math.inf) -> Any:
        """A finite int or float in [lo, hi], as float."""
        v = self._get(name, optional)
        if v is None and optional:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(name, f"must be a number, not {type(v).__name__}")
        if not math.isfinite(v) or not lo <= v <= hi:
            raise self.fail(name, f"= {v!r} is not a finite number in [{lo}, {hi}]")
        return float(v)

    def list(self, name: str, item: Callable[[Any], bool], what: str, *, optional: bool = False,
             max_len: int = 100_000) -> Any:
        v = self._get(name, optional)
        if v is None and optional:
            return None
        if not isinstance(v, list) or len(v) > max_len or not all(item(x) for x in v):
            raise self.fail(name, f"must be a list of {what}")
        return v

    def mapping(self, name: str, *, optional: bool = False) -> "Fields | None":
        v = self._get(name, optional)
        if v is None and optional:
            return None
        if not isinstance(v, dict):
            raise self.fail(name, f"must be a mapping, not {type(v).__name__}")
        return Fields(self.path, v, f"{self.prefix}{name}.")
