"""Where rgpt-prep writes, and what it may delete.

OUT is built in OUT.partial and put in place only when complete, by `swap_dir`: at every moment OUT
holds either the old dataset or the new one. Every file and rename is fsynced (rgpt_dist.durable), so
a crash leaves a resumable OUT.partial, never a torn file or a dataset that only seems complete.

rgpt-prep deletes a directory only when it can prove it made it:
- OUT.partial holds PLAN, written right after rgpt-prep creates the directory (an empty OUT.partial,
  or one holding only PLAN's temporary file, is also taken: there is nothing in it to lose). Any
  other OUT.partial is refused with exit 2 and left as it is.
- OUT, replaced under --overwrite, must hold an rgpt-prep manifest.json.
- swap_dir moves the old OUT aside to `.OUT.old` on filesystems without renameat2(RENAME_EXCHANGE)
  and deletes it there; an existing `.OUT.old` is refused up front, so that is never someone else's.
Problems with --out are usage errors (OutputError, exit 2) whose message names the path.

One run at a time per OUT: two runs building the same OUT.partial would interleave their parts and
could publish a mixed dataset. Each run holds an exclusive POSIX lock (fcntl.lockf, as the trainer's
run lock: released when the process dies, not inherited by forked tokenizer workers) on `.OUT.lock`
beside OUT, taken before OUT.partial is inspected and kept until the run ends; a second run is refused
at once (exit 2) naming the lock file and its holder. The lock file is removed when the run ends
(a killed run leaves it, unlocked and harmless); a run that locks it checks that it is still the
file at that path, so a run that opened it just before it was removed cannot share the lock.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import shutil
import sys
from pathlib import Path
from typing import Any

from data_prep.sources import open_regular
from rgpt_dist.durable import UnsafePath, atomic_write_text, fsync_dir, fsync_tree, swap_dir
from rgpt_dist.durable import open_regular as open_for_write

FORMAT = "rgpt-dist/tokens-mds-v1"
PLAN = "plan.json"
CREATED_BY = "rgpt-prep"
PLAN_TMP = f".{PLAN}.tmp"  # prefix of atomic_write_text's temporary name: a crash may leave only it


class OutputError(Exception):
    """A problem with --out or what lies beside it: a usage error (exit 2)."""


def staging_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def aside_dir(out: Path) -> Path:
    return out.with_name(f".{out.name}.old")  # the name swap_dir's fallback uses


def lock_file(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def lock_out(out: Path) -> int:
    """Take the lock on OUT (see the module docstring) and return its descriptor, for release_out;
    OutputError naming the lock file and its holder when another run holds it."""
    path = lock_file(out)
    for _ in range(10):  # the file we locked was removed by a run that just ended: lock the new one
        fd = _open_lock(out, path)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):  # EAGAIN / EACCES: another process holds it
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise OutputError(f"another rgpt-prep run is writing {out}: {path} is locked by {holder}; wait "
                              f"for it to finish (or stop it) and run again") from None
        except OSError as e:  # a filesystem without locks: say so, and go on as before locks existed
            print(f"rgpt-prep: warning: cannot lock {path} ({e.strerror or e}): nothing stops a second run "
                  f"writing {out} at the same time", file=sys.stderr)
        mine = os.fstat(fd)
        try:
            now = os.lstat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"rgpt-prep pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
            return fd
        os.close(fd)
    raise OutputError(f"--out {out}: {path} keeps being replaced; cannot take the lock")


def _open_lock(out: Path, path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # check_out: its existing ancestors are directories
        return open_for_write(path, os.O_RDWR | os.O_CREAT)
    except UnsafePath as e:
        raise OutputError(f"--out {out}: lock file {e}") from None
    except OSError as e:
        raise OutputError(f"--out {out}: cannot create the lock file {path}: {e.strerror or e}") from None


def release_out(out: Path, fd: int) -> None:
    """Remove the lock file (still holding the lock: a run waiting on this file finds it gone and
    locks a new one) and release the lock."""
    try:
        os.unlink(lock_file(out))
    except FileNotFoundError:
        pass
    os.close(fd)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def _read_json(path: Path) -> Any:
    """A JSON file's content, or None; only a regular file is opened (a FIFO named manifest.json
    would otherwise block)."""
    try:
        with open_regular(path) as fh:
            return json.loads(fh.read())
    except (OSError, ValueError, RecursionError):
        return None


def _entries(d: Path) -> set[str]:
    with os.scandir(d) as it:
        return {e.name for e in it}


def read_plan(staging: Path) -> dict | None:
    plan = _read_json(staging / PLAN)
    return plan if isinstance(plan, dict) and plan.get("created_by") == CREATED_BY else None


def _owned_staging(staging: Path) -> bool:
    return read_plan(staging) is not None or all(e.startswith(PLAN_TMP) for e in _entries(staging))


def is_dataset(d: Path) -> bool:
    manifest = _read_json(d / "manifest.json")
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse, before any work, an --out that cannot be a dataset directory or whose writing would
    replace or delete something rgpt-prep did not make."""
    try:
        _check_out(out, overwrite)
    except OSError as e:  # e.g. a parent without search permission
        raise OutputError(f"--out {out}: {e.strerror or e}") from None


def _check_out(out: Path, overwrite: bool) -> None:
    if out.name in ("", ".", ".."):
        raise OutputError(f"--out {out}: name the dataset directory itself, not '.', '..' or '/'")
    for parent in Path(os.path.abspath(out)).parents:  # the nearest existing ancestor must be a directory
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"--out {out}: {parent} is not a directory")
            break
    if out.is_symlink():
        raise OutputError(f"--out {out} is a symbolic link; give the directory it points to")
    if out.exists():
        if not out.is_dir():
            raise OutputError(f"--out {out} exists and is not a directory")
        if _entries(out) and not overwrite:
            raise OutputError(f"output {out} exists and is not empty; pass --overwrite to replace it")
        if _entries(out) and not is_dataset(out):
            raise OutputError(f"--overwrite: {out} is not an rgpt-prep dataset (no manifest.json of "
                              f"rgpt-prep's in it); refusing to replace it")
        aside = aside_dir(out)
        if aside.exists() or aside.is_symlink():
            raise OutputError(f"{aside} exists; replacing {out} may use that name: move or remove it")
    staging = staging_dir(out)
    if staging.is_symlink() or staging.exists() and not (staging.is_dir() and _owned_staging(staging)):
        raise OutputError(f"{staging} exists and was not made by rgpt-prep (no {PLAN} of rgpt-prep's in "
                          f"it); rgpt-prep builds {out} there: move or remove it")


def prepare_staging(staging: Path, fingerprint: str, resume: bool) -> None:
    """Reuse an interrupted run's completed parts when it had the same inputs and options; else start
    afresh. check_out has established that an existing staging directory is rgpt-prep's; that is
    checked again here, since hashing the inputs may have taken hours."""
    plan = read_plan(staging) if staging.is_dir() else None
    if plan is None and staging.is_dir() and not _owned_staging(staging):  # made while the inputs were hashed
        raise OutputError(f"{staging} appeared during the run and was not made by rgpt-prep: move or remove it")
    if plan is not None:
        same = plan.get("fingerprint") == fingerprint
        if resume and same:
            print(f"rgpt-prep: resuming the interrupted run in {staging}", file=sys.stderr)
            (staging / "parts").mkdir(exist_ok=True)
            return
        why = "--no-resume" if same else "its inputs or options differ"
        print(f"rgpt-prep: discarding the interrupted run in {staging} ({why})", file=sys.stderr)
        shutil.rmtree(staging)
    try:
        staging.mkdir(parents=True, exist_ok=True)  # an existing one is empty (check_out)
        fsync_dir(staging.parent)
        write_json(staging / PLAN, {"created_by": CREATED_BY, "format": FORMAT, "fingerprint": fingerprint})
        (staging / "parts").mkdir()
    except OSError as e:
        raise OutputError(f"cannot create {staging}: {e.strerror or e}") from None


def seal_part(staging: Path, splits: tuple[str, ...], name: str) -> None:
    """Make a written part's shards durable before its record claims them."""
    for s in splits:
        fsync_tree(staging / s / name)
        fsync_dir(staging / s)
    fsync_dir(staging)


def publish(staging: Path, out: Path) -> None:
    """Put the finished dataset at OUT (swap_dir fsyncs it first), then drop the bookkeeping that made
    the run resumable. A crash between the two leaves a complete dataset with two extra entries."""
    swap_dir(staging, out)
    shutil.rmtree(out / "parts")
    (out / PLAN).unlink()
    fsync_dir(out)
