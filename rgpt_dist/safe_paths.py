"""Output directories that the CLIs write into (rgpt-export OUT, rgpt-eval --out): what they refuse,
and private staging directories that an interrupted run does not leave behind (docs/security.md).

    out = out_dir(args.out)                     # refuses a file, a dangling link, a link to a directory
    refuse_overlap(out, run_dir, "the run being exported")
    with staging(out.parent, f".{out.name}.rgpt-export-") as tmp:   # removes stale ones of the prefix first
        ...write into tmp...
        publish(tmp, out)                       # or swap the whole tree into place

OUT itself must be a real directory or absent. Links among OUT's *ancestors* are followed, on
purpose: clusters put scratch and project space behind links ($HOME/scratch -> /lustre/...), the
ancestors are the location the user chose, and `out_dir` resolves them once so that every later step
(the SRC comparison, the swap, the writes) uses the same real directory. A link as OUT's last
component is refused instead: replacing or writing into it would act on whatever it points to.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

MARKER = ".rgpt-staging"  # inside every staging directory: locked while its writer runs


class UnsafeOutput(ValueError):
    """An output path that cannot be used as it is, with the reason (the CLIs exit with status 2; a
    ValueError as the CLIs already map those, unlike rgpt_dist.durable.UnsafePath for single files)."""


def _kind(path: Path) -> str | None:
    """Why `path` cannot be an output directory, or None (a real directory, or nothing there)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        if not os.path.exists(path):
            return f"is a dangling symbolic link (to {target})"
        if os.path.isdir(path):
            return f"is a symbolic link to a directory ({target}): give the directory itself"
        return f"is a symbolic link (to {target})"
    if stat.S_ISDIR(st.st_mode):
        return None
    return "is a regular file, not a directory" if stat.S_ISREG(st.st_mode) else "is not a directory"


def out_dir(path: str | Path) -> Path:
    """The output directory `path`, absolute with its ancestors resolved (see module doc), after
    refusing one that is a file, a dangling symbolic link or a link (to a directory or anything)."""
    path = Path(path)
    reason = _kind(path)
    if reason:
        raise UnsafeOutput(f"{path} {reason}: refusing to use it as the output directory")
    if path.name in ("", ".", ".."):  # '.' and '..' name real directories, never links
        return Path(os.path.realpath(path))
    return Path(os.path.realpath(path.parent)) / path.name


def _chain(path: Path) -> list[os.stat_result]:
    """stat of path and of each of its existing ancestors (for identity checks across bind mounts)."""
    out = []
    for p in (path, *path.parents):
        try:
            out.append(os.stat(p))
        except OSError:
            continue
    return out


def refuse_overlap(out: Path, protected: str | Path, what: str) -> None:
    """`out` (from out_dir) must be neither `protected` nor inside it nor above it: compared as
    resolved paths and, for existing directories, by identity (another path to the same place)."""
    prot = Path(os.path.realpath(protected))
    real = Path(os.path.realpath(out))
    if real == prot:
        raise UnsafeOutput(f"{out} is {what} ({protected}): refusing to write into or replace it")
    if prot in real.parents or (prot.exists() and any(os.path.samestat(os.stat(prot), s) for s in _chain(real))):
        raise UnsafeOutput(f"{out} is inside {what} ({protected}): choose an output directory outside it")
    if real in prot.parents or (real.exists() and any(os.path.samestat(os.stat(real), s) for s in _chain(prot))):
        raise UnsafeOutput(f"{out} contains {what} ({protected}): refusing to write into or replace it")


def _rmtree(path: str | Path) -> None:
    """Remove a tree without following any link in it (shutil's fd-based rmtree; it also refuses a
    link as the top). Platforms without that variant are refused rather than risked."""
    if not shutil.rmtree.avoids_symlink_attacks:
        raise UnsafeOutput(f"cannot remove {path} safely on this platform (no symlink-safe rmtree)")
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass


def _stale(parent: Path, name: str) -> bool:
    """Whether parent/name is a staging directory whose writer is gone: a real directory holding a
    regular MARKER file that nobody holds locked (a live writer keeps it locked)."""
    try:
        dfd = os.open(parent / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False  # gone, a link, or not a directory: not ours
    try:
        fd = os.open(MARKER, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
    except OSError:
        return False  # no marker: not ours (or sealed by a writer about to swap it into place)
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # locked by a live writer (or locks unsupported here: leave it)
        return False
    finally:
        os.close(fd)


def remove_stale(parent: str | Path, prefix: str) -> list[Path]:
    """Remove the staging directories of interrupted runs in `parent`: only names `prefix` + mkdtemp's
    8 random characters that pass `_stale`. Returns what was removed (each is also warned about)."""
    parent, removed = Path(parent), []
    pattern = re.compile(re.escape(prefix) + r"[a-z0-9_]{8}")
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return removed
    for name in sorted(n for n in names if pattern.fullmatch(n)):
        if _stale(parent, name):
            _rmtree(parent / name)
            warnings.warn(f"removed {parent / name}: the staging directory of an interrupted run", stacklevel=2)
            removed.append(parent / name)
    return removed


@contextmanager
def staging(parent: str | Path, prefix: str):
    """A new private directory parent/<prefix><8 random characters> (mode 0700), holding MARKER locked
    for as long as the block runs; removed (links not followed) when the block ends, however it ends.
    Stale staging directories of the same prefix are removed first. Remove MARKER (`seal`) before
    moving the directory itself into place."""
    remove_stale(parent, prefix)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    fd = os.open(tmp / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # no locks on this filesystem: _stale cannot lock it either, so it is never taken for stale
        os.write(fd, json.dumps({"pid": os.getpid(), "prefix": prefix}).encode())
        yield tmp
    finally:
        try:
            _rmtree(tmp)
        finally:
            os.close(fd)


def seal(tmp: Path) -> None:
    """Remove the marker of a staging directory that is about to become the output itself."""
    os.unlink(tmp / MARKER)


def publish(staged: str | Path, out: str | Path) -> list[Path]:
    """Move everything in the staging directory `staged` into the directory `out` (its MARKER aside),
    replacing files of the same names. Each file is renamed into place, which replaces the directory
    entry and never writes through a link; a link, or anything but a regular file or directory, where
    an output goes is refused, naming it, before anything is moved. Returns the paths written."""
    moves: list[tuple[str, Path]] = []
    _plan(Path(staged), Path(out), moves, top=True)
    for src, dst in moves:
        os.replace(src, dst)
    return [dst for _, dst in moves]


def _plan(src_dir: Path, dst_dir: Path, moves: list, top: bool = False) -> None:
    with os.scandir(src_dir) as entries:
        entries = sorted(entries, key=lambda e: e.name)
    for entry in entries:
        if top and entry.name == MARKER:
            continue
        dst = dst_dir / entry.name
        try:
            st = os.lstat(dst)
        except FileNotFoundError:
            moves.append((entry.path, dst))
            continue
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeOutput(f"{dst} is a symbolic link (to {os.readlink(dst)}): refusing to write through it; "
                             "remove it or choose another output directory")
        if entry.is_dir(follow_symlinks=False):
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafeOutput(f"{dst} is not a directory: refusing to replace it")
            _plan(Path(entry.path), dst, moves)
        elif stat.S_ISREG(st.st_mode):
            moves.append((entry.path, dst))
        else:
            raise UnsafeOutput(f"{dst} is not a regular file: refusing to replace it")
