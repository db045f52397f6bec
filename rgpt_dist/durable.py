"""Durable file operations: a rename is only atomic *and* durable when the data is on disk before it
and the directory entry after it.

Every atomic replacement in the project goes through these helpers: write a temporary sibling,
fsync it, rename it over the target, fsync the directory. A crash (or power loss) at any point leaves
either the old file or the new one, never a torn or empty one.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


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


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably (temp sibling, fsync, rename, fsync dir)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")  # concurrent writers never share a temp file
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


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
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return rc == 0
