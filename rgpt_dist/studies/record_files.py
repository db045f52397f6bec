"""How a study's records are read and written (rgpt_dist.studies.records): the one reader, schema and
writer of a record directory and the run directory it is restored into. Records come from other
machines and merges, and the run directory may be one others can write in (docs/security.md):

- record.json is read through rgpt_dist.run_files (a regular file, no link, a FIFO refused without
  blocking, at most MAX_RECORD_JSON_BYTES, strict JSON) and checked against `RecordMeta`; a damaged
  or hostile one is a `RecordError` naming the file and the field;
- every write goes through `_Dir`: the directory opened without following a link, each file a fresh
  temp file renamed into place relative to it, so a link planted at a name is refused or replaced,
  never followed;
- every name from a record or a study is one plain path component (`plain_name`).
No torch import.
"""
from __future__ import annotations

import dataclasses
import datetime
import errno
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from rgpt_dist import run_files
from rgpt_dist.durable import kind

RECORD_JSON = "record.json"
MAX_RECORD_JSON_BYTES = 1 << 20
"""record.json is ~300 bytes; a larger file than 1 MiB is not one (and is not read past that)."""
MAX_RUN_FILE_BYTES = 256 << 20
"""A copied run file (metrics.jsonl: < 1 KiB a logged step; an evaluation's JSON): 256 MiB at most."""
MAX_SECONDS = 1e8
"""A run's wall or training time: ~3 years at most."""
MAX_LAUNCHES = 10 ** 6
_CONFLICT = re.compile(rb"^(<{7}|={7}|>{7})(\s|$)", re.M)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_UTC = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}")


class RecordError(ValueError):
    """A record (or a run directory being written) that cannot be used as it is: the message names
    the file and, for record.json, the field. The study stops with exit status 2 on it."""


def plain_name(name: Any, where: str, *, nested: bool = False) -> str:
    """`name` when it is a plain relative path: one component (or, with `nested`, several), none empty,
    `.` or `..`, no NUL or backslash; RecordError naming `where` otherwise."""
    ok = isinstance(name, str) and 0 < len(name) <= 255 * (16 if nested else 1) and "\0" not in name \
        and "\\" not in name
    parts = name.split("/") if ok else []
    if not ok or any(p in ("", ".", "..") or len(p.encode()) > 255 for p in parts) or (len(parts) > 1 and not nested):
        what = "a plain relative path" if nested else "a plain name (one path component)"
        raise RecordError(f"{where}: {name!r:.120} is not {what}")
    return name


def read_bytes(path: str | Path, max_bytes: int) -> bytes:
    """run_files.read_bytes (a regular file, no link, no FIFO, at most max_bytes), its refusals as
    RecordError; FileNotFoundError when nothing is at `path`."""
    if not os.path.lexists(path):
        raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
    try:
        return run_files.read_bytes(path, max_bytes)
    except run_files.RunFileError as e:
        raise RecordError(str(e)) from None


def read_json(path: str | Path, max_bytes: int = MAX_RECORD_JSON_BYTES) -> Any:
    """run_files.read_json (strict JSON of bounded size and nesting), its refusals as RecordError; a
    file that fails to parse because it holds merge conflict markers is said to."""
    if not os.path.lexists(path):
        raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
    try:
        return run_files.read_json(path, max_bytes)
    except run_files.RunFileError as e:
        if "not valid JSON" in str(e) and (marker := _CONFLICT.search(read_bytes(path, max_bytes))):
            data = marker.string
            line = data.count(b"\n", 0, marker.start()) + 1
            raise RecordError(f"{path}: a merge conflict marker ({marker.group(1).decode()}) on line {line}: "
                              "resolve the merge (or remove the record) and run again") from None
        raise RecordError(str(e)) from None


def _number(v: Any, lo: float, hi: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi


def _integer(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


@dataclasses.dataclass(frozen=True)
class RecordMeta:
    """record.json, as `save` writes it."""

    run: str                   # the run directory's name (one path component)
    wall_s: float              # summed wall time of the launches the launcher saw end, seconds
    launches: int
    train_s: float             # time in training steps (train_seconds)
    data_sha256: str | None    # the dataset manifest's sha256; None for generated tasks
    finished_utc: str          # "YYYY-MM-DD HH:MM", UTC
    cpus: int | None           # os.cpu_count() of the machine (None where unknown)
    note: str | None = None    # a person's remark, kept with the record

    @classmethod
    def from_dict(cls, d: Any, path: str | Path) -> "RecordMeta":
        """The record in `d` (parsed record.json at `path`), each field's type and range checked
        (run_files.Fields); RecordError naming the file and the field for a missing, unknown or
        wrongly typed field, or a value out of range."""
        if not isinstance(d, dict):
            raise RecordError(f"{path}: not a JSON object (a {type(d).__name__}): not a record")
        names = [f.name for f in dataclasses.fields(cls)]
        if unknown := sorted(set(d) - set(names)):
            raise RecordError(f"{path}: unknown field {unknown[0]!r:.80} (a record has {', '.join(names)})")
        f = run_files.Fields(path, d)
        try:
            meta = cls(run=plain_name(f.str("run", max_len=255), f"{path}: run"),
                       wall_s=f.number("wall_s", lo=0.0, hi=MAX_SECONDS),
                       launches=f.int("launches", lo=0, hi=MAX_LAUNCHES),
                       train_s=f.number("train_s", lo=0.0, hi=MAX_SECONDS),
                       data_sha256=f.str("data_sha256", optional=True, pattern=_SHA256),
                       finished_utc=f.str("finished_utc", pattern=_UTC),
                       cpus=f.int("cpus", optional=True, lo=1, hi=1 << 20),
                       note=f.str("note", optional=True, max_len=10_000))
        except run_files.RunFileError as e:
            raise RecordError(str(e)) from None
        if "data_sha256" not in d:
            raise RecordError(f"{path}: data_sha256 is missing (null for a generated task)")
        try:
            datetime.datetime.strptime(meta.finished_utc, "%Y-%m-%d %H:%M")
        except ValueError:
            raise RecordError(f"{path}: finished_utc = {meta.finished_utc!r} is not a date") from None
        return meta


def read_record(path: str | Path) -> RecordMeta:
    """record.json at `path`, read (read_json) and checked (RecordMeta.from_dict)."""
    return RecordMeta.from_dict(read_json(path), path)


def _refusal(path: str | Path, mode: int, want_dir: bool, verb: str) -> str | None:
    """Why the entry at `path` (lstat mode) cannot be written or read through: a symbolic link, or not
    the kind wanted; None when it is a real directory (want_dir) or a regular file."""
    if stat.S_ISLNK(mode):
        return f"{path} is a symbolic link: refusing to {verb} through it (remove it and run again)"
    if stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode):
        return None
    wanted = "a directory" if want_dir else "a regular file"
    return f"{path} is {kind(mode)}, not {wanted}: refusing to {verb} through it (remove it and run again)"


def _entry_problem(path: Path, want_dir: bool, verb: str) -> str | None:
    """_refusal for what is at `path` now (None when nothing is there)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return _refusal(path, mode, want_dir, verb)


def _path_problems(base: Path, name: str, verb: str) -> list[str]:
    """_entry_problem for base/name (a regular file) and each directory between base and it."""
    parts = name.split("/")
    dirs = [base.joinpath(*parts[:i]) for i in range(1, len(parts))]
    out = [p for d in dirs if (p := _entry_problem(d, True, verb))]
    return out or [p for p in [_entry_problem(base / name, False, verb)] if p]


def _read_in(base: Path, name: str, max_bytes: int, verb: str = "read") -> bytes:
    """read_bytes(base / name) after refusing a link or non-directory between base and it."""
    if problems := _path_problems(base, name, verb):
        raise RecordError(problems[0])
    try:
        return read_bytes(base / name, max_bytes)
    except FileNotFoundError:
        raise RecordError(f"{base / name} is missing: the run or record is incomplete") from None


class _Dir:
    """The one writer into run and record directories: a directory opened without following a link
    at its own name (its ancestors are the user's choice, as for RUN_DIR), into which each file is
    written as a fresh O_EXCL temp file renamed into place relative to the open directory, so neither
    a link planted at the directory nor one at the file's name is ever written through."""

    def __init__(self, path: Path, fd: int, verb: str):
        self.path, self.fd, self.verb = path, fd, verb

    @classmethod
    def open(cls, path: str | Path, verb: str) -> "_Dir":
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path)
        except FileExistsError:
            pass
        except OSError as e:
            raise RecordError(f"{path}: cannot be made ({e.strerror or e})") from None
        return cls(path, _open_dir(path, None, verb, path), verb)

    def sub(self, name: str) -> "_Dir":
        """The directory `name` in this one, made if absent, opened the same way."""
        try:
            os.mkdir(name, dir_fd=self.fd)
        except FileExistsError:
            pass
        except OSError as e:
            raise RecordError(f"{self.path / name}: cannot be made ({e.strerror or e})") from None
        return _Dir(self.path / name, _open_dir(name, self.fd, self.verb, self.path / name), self.verb)

    def write(self, name: str, data: bytes) -> None:
        """Put `data` at `name` in this directory, atomically and durably; RecordError when the entry
        there is a directory (a link or FIFO there is replaced, never followed)."""
        tmp = f".{name}.rgpt-tmp{os.getpid()}"
        try:
            os.unlink(tmp, dir_fd=self.fd)  # a stale temp file, or a link planted at its name (not its target)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=self.fd)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as e:  # a directory planted at `name` since the check
            os.unlink(tmp, dir_fd=self.fd)
            raise RecordError(f"{self.path / name}: cannot be replaced ({e.strerror or e}): refusing to "
                              f"{self.verb} through it") from None
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "_Dir":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _open_dir(name: str | Path, dir_fd: int | None, verb: str, shown: Path) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                why = _refusal(shown, os.lstat(name, dir_fd=dir_fd).st_mode, True, verb)
            except OSError:
                why = None
            raise RecordError(why or f"{shown}: not a directory: refusing to {verb} through it") from None
        raise RecordError(f"{shown}: cannot be opened ({e.strerror or e})") from None
