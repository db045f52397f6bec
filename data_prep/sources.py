"""Input discovery: command-line inputs -> the regular files to read, hashed, in a fixed order.

Only regular files are ever read. A FIFO, socket or device (directly, through a symbolic link, in a
walked directory or named on the command line) is reported and skipped without being opened: opening
a FIFO with no writer blocks forever, and a device such as /dev/zero never ends. Links to directories
are never followed while walking a directory or expanding `**` (they can form cycles); a directory
or link named on the command line, or matched by a wildcard that is not `**`, is followed. Every
problem goes to the Report with its path; nothing raises past one input.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import stat
import sysconfig
from pathlib import Path
from typing import BinaryIO

from data_prep.report import Report

STDLIB = "python-stdlib"
TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".java", ".js",
                 ".ts", ".go", ".rs", ".rb", ".sh", ".tex", ".html", ".htm", ".css", ".xml", ".yaml",
                 ".yml", ".toml", ".cfg", ".ini", ".csv", ".tsv", ".text"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}
PARQUET_SUFFIXES = {".parquet"}
COMPRESSIONS = {".gz": "gz", ".zst": "zst", ".zstd": "zst"}
NOT_REGULAR = "not a regular file"


@dataclasses.dataclass(frozen=True)
class InputFile:
    path: str
    fmt: str                 # text | jsonl | parquet
    compression: str | None  # None | gz | zst
    size: int
    sha256: str


class NotRegularFile(OSError):
    """A path that is (or became) something other than a regular file."""


def classify(path: Path) -> tuple[str | None, str | None]:
    """(format, compression) from the file name; format None = not a recognised corpus file."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    if last in JSONL_SUFFIXES:
        return "jsonl", compression
    if last in PARQUET_SUFFIXES:
        return "parquet", compression
    if last in TEXT_SUFFIXES:
        return "text", compression
    return None, compression


def file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return kind
    return "special file"


def open_regular(path: str | Path) -> BinaryIO:
    """Open a regular file for reading, refusing anything else. Discovery already checked with stat;
    this second check (fstat of the opened descriptor) covers a file replaced by a FIFO or a device
    since. O_NONBLOCK makes that open itself return at once on a FIFO; it is cleared before reading."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(0, file_kind(mode), str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def stdlib_files() -> list[Path]:
    """The local CPython standard library sources (site-packages excluded), one document per file."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "__pycache__" not in p.parts)


def _walk(root: Path, report: Report) -> list[tuple[Path, bool]]:
    """Every file under root, sorted. Links to directories are reported, not followed (they can form
    cycles or leave the tree); unreadable directories are reported instead of silently missing."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: report.skip(
            "unreadable directory", str(e.filename), detail=e.strerror or type(e).__name__)):
        for d in [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            report.skip("symbolic link to a directory (not followed)", os.path.join(dirpath, d))
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        found += [(Path(dirpath) / f, False) for f in sorted(filenames)]
    return found


def glob_files(spec: str) -> list[str]:
    """The paths a glob matches. `**` (any depth) is expanded by pathlib, which does not descend into
    symbolic links to directories: glob.glob(recursive=True) does, with no cycle detection, so a link to
    its own parent makes it branch at every level (two such links: 2^40 paths before ELOOP ends it).
    As with glob, wildcards do not match hidden names (starting with '.'), and `dir/**` means every
    file under dir."""
    if "**" not in spec:
        return glob.glob(spec)
    parts = Path(spec).parts
    first = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    base, rest = Path(*parts[:first]) if first else Path(), list(parts[first:])
    if rest[-1] == "**":
        rest.append("*")  # pathlib's trailing ** yields directories only
    hidden_ok = any(part.startswith(".") for part in rest)
    found = []
    for path in base.glob("/".join(rest)):
        if hidden_ok or not any(part.startswith(".") for part in path.parts[len(base.parts):]):
            found.append(str(path))
    return found


def _expand(spec: str, report: Report) -> list[tuple[Path, bool]]:
    """(path, explicitly named) pairs for one command-line input."""
    if spec == STDLIB:
        return [(p, False) for p in stdlib_files()]
    if any(c in spec for c in "*?["):
        matches = sorted(glob_files(spec))
        if not matches:
            report.skip("no file matches the pattern", spec)
        return [(Path(m), False) for m in matches if not Path(m).is_dir()]
    path = Path(spec)
    if path.is_dir():  # followed even when it is a link: the user named it
        return _walk(path, report)
    if path.exists() or path.is_symlink():
        return [(path, True)]
    report.skip("input does not exist", spec)
    return []


def _hash(path: Path) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with open_regular(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()


def _regular(path: Path, report: Report) -> bool:
    """Whether path (links followed) is a regular file; anything else is reported, never opened."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        report.skip("unreadable file", str(path), detail=e.strerror or type(e).__name__)
        return False
    if not stat.S_ISREG(mode):
        report.skip(NOT_REGULAR, str(path), detail=file_kind(mode))
        return False
    return True


def discover(specs: list[str], report: Report) -> list[InputFile]:
    """Expand inputs into files (command-line order, directories sorted), hash them, drop duplicates."""
    files, seen_paths, seen_hashes = [], set(), {}
    for spec in specs:
        for path, explicit in _expand(spec, report):
            fmt, compression = classify(path)
            if fmt is None and not explicit:
                report.skip("unsupported file type", str(path))
                continue
            fmt = fmt or "text"  # a file named explicitly is read as text whatever its name
            if not _regular(path, report):
                continue
            real = os.path.realpath(path)
            if real in seen_paths:
                report.skip("duplicate input (same file)", str(path))
                continue
            seen_paths.add(real)
            try:
                size, digest = _hash(path)
            except OSError as e:  # NotRegularFile: it changed since the stat above
                reason = NOT_REGULAR if isinstance(e, NotRegularFile) else "unreadable file"
                report.skip(reason, str(path), detail=e.strerror or type(e).__name__)
                continue
            if digest in seen_hashes:
                report.skip("duplicate input (same content)", str(path), detail=f"as {seen_hashes[digest]}")
                continue
            seen_hashes[digest] = str(path)
            files.append(InputFile(str(path), fmt, compression, size, digest))
    return files
