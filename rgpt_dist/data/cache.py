"""A private per-user cache directory for downloaded and decompressed shards.

A fixed path under /tmp is shared by every user of a machine: another user could create it first and
feed us their shards, or read ours. The cache is `$TMPDIR/rgpt-cache-<uid>/<name>`, created mode
0700; an existing one is used only when it is a real directory (not a link) owned by us and not
readable or writable by anyone else. Anything else is refused with the reason.
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


class UnsafeCacheDir(RuntimeError):
    """A cache directory that another user could have planted or can read."""


def check_private(path: Path) -> Path:
    """path, after checking it is a directory (not a link) owned by this user, mode 0700 or stricter."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheDir(f"{path}: expected a private directory, found {'a link' if stat.S_ISLNK(st.st_mode) else 'a file'}")
    if st.st_uid != os.getuid():
        raise UnsafeCacheDir(f"{path}: owned by uid {st.st_uid}, not by this user ({os.getuid()}): refusing to use it")
    if st.st_mode & 0o077:
        raise UnsafeCacheDir(f"{path}: mode {stat.S_IMODE(st.st_mode):o} lets other users in; expected 0700 "
                             f"(chmod 700 it if it is yours, or remove it)")
    return path


def private_dir(path: str | Path) -> Path:
    """Create `path` (and missing parents) mode 0700, or check an existing one; returns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    return check_private(path)


def cache_dir(name: str, configured: str | None = None) -> Path:
    """The cache for `name` (e.g. "streaming"): `configured` when the user set one (checked the same
    way), else a private directory under the temp directory."""
    if configured:
        return private_dir(configured)
    root = private_dir(Path(tempfile.gettempdir()) / f"rgpt-cache-{os.getuid()}")
    return private_dir(root / name)
