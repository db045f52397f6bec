"""Durable file operations: a rename is only atomic *and* durable when the data is on disk before it
and the directory entry after it.

Every atomic replacement in the project goes through these helpers: write a temporary sibling,
fsync it, rename it over the target, fsync the directory. A crash (or power loss) at any point leaves
either the old file or the new one, never a torn or empty one.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
from pathlib import Path
import ctypes
import ctypes.util


class UnsafePath(RuntimeError):
    """A path we were about to write (or read) is a symbolic link or not a regular file: in a shared
    directory that is how another user redirects our writes (a planted link) or blocks us (a FIFO)."""


_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFDIR: "a directory",
          stat.S_IFREG: "a regular file"}


def kind(mode: int) -> str:
    """'a symbolic link', 'a FIFO', ... for an lstat mode (what a refusal message calls the entry)."""
    return _KINDS.get(stat.S_IFMT(mode), "of an unknown kind")


def open_regular(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """os.open for a regular file only: a symbolic link at `path` is not followed and a FIFO, device
    or socket is not opened for use (O_NONBLOCK keeps a FIFO from blocking the open itself); either
    raises UnsafePath naming the path. Returns the descriptor, in blocking mode."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # a link (O_NOFOLLOW); a FIFO opened to write with no reader
            what = kind(os.lstat(path).st_mode)
            raise UnsafePath(f"{path} is {what}: refusing to open it (remove it and run again)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePath(f"{path} is {kind(st.st_mode)}, not a regular file: refusing to open it")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries (a rename into it, a file created in it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """fsync every regular file and directory under root (before renaming the whole tree into place)."""
    root = Path(root)
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
        fsync_dir(dirpath)


def _written_temp(path: Path, data: bytes) -> Path:
    """`data` in a fresh temp sibling of `path`, fsynced."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")  # concurrent writers never share a temp file
    try:  # a stale temp file of a killed writer, or a link planted at the predictable name: unlink it
        os.unlink(tmp)  # (the link itself, never its target)
    except FileNotFoundError:
        pass
    # O_EXCL: created here, never opened through a link or a file someone else made in between
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return tmp


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably (temp sibling, fsync, rename, fsync dir)."""
    path = Path(path)
    os.replace(_written_temp(path, data), path)
    fsync_dir(path.parent)


def atomic_create_text(path: str | Path, text: str) -> bool:
    """Create `path` holding `text`, whole or not at all, unless something is there already (then
    False: the first of several writers stands). A hard link of a complete temp file: link(2) never
    replaces an entry, a planted link included."""
    path = Path(path)
    tmp = _written_temp(path, text.encode("utf-8"))
    try:
        os.link(tmp, path)
        created = True
    except FileExistsError:
        created = False
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)
    return created


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def durable_replace(src: str | Path, dst: str | Path) -> None:
    """os.replace(src, dst) for a file already written and fsynced, then fsync dst's directory."""
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


def swap_dir(new: str | Path, dst: str | Path) -> None:
    """Put the complete directory `new` at `dst`, replacing any directory there, with no moment at
    which `dst` holds neither the old tree nor the new one.

    Uses renameat2(RENAME_EXCHANGE) where the platform has it (Linux >= 3.15), so `dst` is always one
    of the two trees. Elsewhere it falls back to rename-aside-then-rename: for one rename `dst` is
    absent, with the old tree still on disk beside it as `.<dst>.old`.
    """
    new, dst = Path(new), Path(dst)
    fsync_tree(new)
    if not dst.exists():
        os.replace(new, dst)
        fsync_dir(dst.parent)
        return
    if _exchange(new, dst):  # dst is the new tree, `new` now holds the old one
        fsync_dir(dst.parent)
        shutil.rmtree(new)
        return
    aside = dst.with_name(f".{dst.name}.old")
    if aside.exists():
        shutil.rmtree(aside)
    os.replace(dst, aside)
    os.replace(new, dst)
    fsync_dir(dst.parent)
    shutil.rmtree(aside)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2 RENAME_EXCHANGE); False when unsupported."""

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return rc == 0
