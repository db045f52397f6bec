"""What the trainer writes in a run directory, and the check that nothing there redirects it.

Run directories live on shared cluster file systems, where another user may be able to create
entries in them. A symbolic link planted at `metrics.jsonl`, `.lock`, `checkpoints/` or `wandb/`
would make the trainer append to, truncate or write files elsewhere (another run's metrics, a
home directory); a FIFO would block it. So:

- before any process starts (launcher/train.py), `unsafe_entries` lists every entry the trainer
  will write that is a link or of the wrong kind, and the run stops with exit status 2 naming each;
- files are opened with no-follow semantics (`durable.open_regular`) and atomic replacements use a
  fresh O_EXCL temp file, so an entry planted after the start is refused, not followed;
- a save that meets a planted `step_N` entry (a link, a file) refuses on every rank together
  (`tag_problem`, called by CheckpointManager.save) instead of deleting or writing through it.

RUN_DIR and checkpoint.dir themselves are the user's own choice (they may be links, e.g. to a
scratch file system); everything beneath them is checked.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from rgpt_dist.durable import kind

RUN_FILES = (".lock", "metrics.jsonl", "config.yaml", "wandb_run_id")
"""Files the trainer (rank 0) writes directly in RUN_DIR."""
RUN_DIRS = ("wandb",)
"""Directories others write in RUN_DIR for us (wandb's offline/online run files)."""
CHECKPOINT_DIR = "checkpoints"
"""checkpoint.dir when unset: a directory inside RUN_DIR, so it is checked like any entry."""


def _problem(path: Path, want_dir: bool) -> str | None:
    """Why `path` cannot be written through (a link, the wrong kind), None when absent or fine."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a parent is a file: reported for the parent
        return None
    ok = stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode)
    if ok:
        return None
    wanted = "a directory" if want_dir else "a regular file"
    return f"{path} is {kind(mode)}, not {wanted}: refusing to write through it (remove it, or choose another run directory)"


def checkpoint_entries(ckpt_dir: Path) -> list[str]:
    """Problems in a checkpoint directory: `latest` and `best.json` must be files, every `step_*` a
    real directory."""
    out = [p for name in ("latest", "best.json") if (p := _problem(ckpt_dir / name, want_dir=False))]
    if ckpt_dir.is_dir():
        out += [p for e in sorted(ckpt_dir.iterdir()) if e.name.startswith("step_")
                and (p := _problem(e, want_dir=True))]
    return out


def unsafe_entries(run_dir: str | Path, checkpoint_dir: str | Path | None) -> list[str]:
    """One message per entry of RUN_DIR (and the checkpoint directory) the trainer would write
    through that is a symbolic link, a FIFO, a device or of the wrong kind."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []  # created by the run; preflight reports a RUN_DIR that is a file
    out = [p for name in RUN_FILES if (p := _problem(run_dir / name, want_dir=False))]
    out += [p for name in RUN_DIRS if (p := _problem(run_dir / name, want_dir=True))]
    if checkpoint_dir:
        ckpt = Path(checkpoint_dir)
    else:
        ckpt = run_dir / CHECKPOINT_DIR
        if problem := _problem(ckpt, want_dir=True):
            return out + [problem]
    return out + checkpoint_entries(ckpt)


def tag_problem(tag_dir: Path) -> str | None:
    """Why a save cannot (re)create `tag_dir`: None when absent or a real directory (a torn attempt
    at the same step, deleted without following links inside it)."""
    return _problem(tag_dir, want_dir=True)
