"""Checkpoints that are complete or invisible, and loaded without running code.

A checkpoint is the directory DIR/step_NNNNNNNN written by DeepSpeed (model, optimizer, scheduler,
client state: step, tokens, loader state, resolved config) plus one RNG file per rank. It becomes
visible only after every rank has finished writing: rank 0 then records a sha256 of every file in
`checksums.json` and points DIR/latest at it, each written atomically and durably (temp file, fsync,
rename, fsync of the directory). On start the newest checkpoint that verifies (every file listed,
every listed file present and matching, nothing else in the directory) is loaded; incomplete or
corrupted ones are skipped with a warning. Only the last `keep_last` complete checkpoints are kept,
and the best one (checkpoint.keep_best): DIR/best.json = {"tag", "step", "val_loss"} names it,
written atomically by rank 0 once that checkpoint is complete and before `latest` moves to it, and
pruning never deletes it. A kill between the checkpoint's record and best.json leaves best.json one
best behind: a resume rewrites it from the best the checkpoint's client state carries
(`record_best`). best.json is read as data (rgpt_dist.run_files: a regular file only, so a FIFO
planted there cannot block the trainer; its tag a checkpoint tag, nothing else).

Checkpoints are read through `SafeCheckpointEngine`: DeepSpeed's files are unpickled with torch's
restricted loader (rgpt_dist.safe_load), so a shared or downloaded run directory cannot run code.
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rgpt_dist.checkpoints.record import RECORD, TAG_PREFIX, checksums, verify
from rgpt_dist.durable import UnsafePath, atomic_write_text, fsync_tree
from rgpt_dist.parallel.deepspeed_lib import TorchCheckpointEngine
from rgpt_dist.parallel.universal import convert, deepspeed_loads_restricted
from rgpt_dist.run_files import TAG, RunFileError, read_mapping
from rgpt_dist.safe_load import UntrustedCheckpoint, load_pt, scan_pt
from rgpt_dist.train.run_dir import tag_problem

RUN_CONFIG = "run_config.json"
BEST = "best.json"
UNIVERSAL_DIR = "universal"  # DIR/universal/<tag>: a checkpoint converted for another layout (removed by the next save)
"""The config of the run that wrote a checkpoint, plain JSON: checked against a resuming run before
any state is loaded (a different precision or sharding would otherwise fail inside DeepSpeed)."""


@dataclass(frozen=True)
class BestRecord:
    """DIR/best.json: the best checkpoint's tag, its step and validation loss."""

    tag: str
    step: int
    val_loss: float


def read_best(path: Path) -> BestRecord:
    """best.json, every field checked: the tag a checkpoint tag of its step (never a path elsewhere)."""
    f = read_mapping(path, limit=4096)
    step = f.int("step", lo=0, hi=10**8 - 1)
    tag = f.str("tag", pattern=TAG)
    if tag != f"{TAG_PREFIX}{step:08d}":
        raise f.fail("tag", f"= {tag!r} is not the tag of step {step}")
    return BestRecord(tag, step, f.number("val_loss"))


class SaveRefused(UnsafePath):
    """Raised on every rank together when a save meets an entry it must not write through."""


class SaveFailed(RuntimeError):
    """Raised on every rank together when a checkpoint could not be written (a full disk, a directory
    made read-only, an I/O error) on any rank: the attempt is removed and the previous checkpoint
    stays the newest complete one."""


class ConversionFailed(RuntimeError):
    """Raised on every rank together when a checkpoint written at another layout could not be
    converted (rgpt_dist/parallel/universal.py): nothing was loaded, the checkpoint is untouched."""


class _GuardedWrites:
    """DeepSpeed's checkpoint engine with its writes guarded: a write that fails is recorded (the
    first one, with its path) instead of raised, so that this rank still joins every collective of
    DeepSpeed's save (its barriers) and the ranks can then agree that the save failed. A rank that
    raised inside DeepSpeed's save would leave the others waiting in its final barrier."""

    def __init__(self, engine):
        self.engine, self.failure = engine, None
        self.original = engine.checkpoint_engine.save

    def __enter__(self) -> "_GuardedWrites":
        self.engine.checkpoint_engine.save = self.save
        return self

    def __exit__(self, *exc) -> None:
        del self.engine.checkpoint_engine.save  # the class's method again

    def save(self, state_dict, path: str) -> None:
        self.write(lambda: self.original(state_dict, path), path)

    def write(self, action, path) -> None:
        if self.failure is None:
            self.failure = _attempt(action, path)


def _attempt(action, path) -> str | None:
    """Run one write: None, or what failed (an OSError, or torch's RuntimeError for a failed stream
    write, whose text does not say why: the filesystem's state is added)."""
    try:
        action()
    except (OSError, RuntimeError) as e:
        text = str(e).strip()
        return f"{path}: {type(e).__name__}: {text.splitlines()[0][:300] if text else ''} ({_filesystem(path)})"
    return None


def _filesystem(path) -> str:
    """'N bytes free there' or 'the filesystem is read-only', for the nearest existing parent."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        st = os.statvfs(where)
    except OSError as e:
        return f"cannot stat {where}: {e}"
    return "the filesystem is read-only" if st.f_flag & os.ST_RDONLY else f"{st.f_bavail * st.f_frsize:,} bytes free there"


def safe_checkpoint_engine(engine, trust: bool):
    """Swap the DeepSpeed engine's checkpoint engine for one whose loads are restricted (the writer
    is untouched). DeepSpeed reads model, optimizer and ZeRO partition files through it."""
    current = engine.checkpoint_engine
    if type(current) is not TorchCheckpointEngine:  # a decoupled/async engine would need its own wrapper
        raise RuntimeError(f"unexpected DeepSpeed checkpoint engine {type(current).__name__}")

    class SafeCheckpointEngine(TorchCheckpointEngine):
        def load(self, path: str, map_location=None):
            return load_pt(path, trust=trust, map_location=map_location)

    safe = SafeCheckpointEngine.__new__(SafeCheckpointEngine)
    safe.__dict__.update(current.__dict__)
    engine.checkpoint_engine = safe
    return safe


class CheckpointManager:
    def __init__(self, directory: str | Path, keep_last: int, rank: int, trust: bool = False):
        self.dir, self.keep_last, self.rank, self.trust = Path(directory), keep_last, rank, trust

    def tags(self) -> list[Path]:
        """Checkpoint directories, newest first (real directories only: a link named step_N is not
        one of ours, and is neither loaded nor pruned)."""
        if not self.dir.is_dir():
            return []
        return sorted((p for p in self.dir.iterdir() if p.name.startswith(TAG_PREFIX) and p.is_dir()
                       and not p.is_symlink()), key=lambda p: p.name, reverse=True)

    def save(self, engine, step: int, client_state: dict[str, Any], best: dict[str, Any] | None = None) -> Path:
        """Collective: every rank calls it. With `best` ({"step": step, "val_loss": v}), this
        checkpoint becomes the best one: best.json names it once it is complete, before pruning."""
        tag = f"{TAG_PREFIX}{step:08d}"
        tag_dir = self.dir / tag
        problem = [None]
        if self.rank == 0:  # a link or file planted at step_N: refused on every rank, nothing written
            problem[0] = tag_problem(tag_dir)
            if problem[0] is None and tag_dir.exists():  # a torn attempt at the same step (rmtree
                shutil.rmtree(tag_dir)  # never follows links inside it)
        dist.broadcast_object_list(problem, src=0)
        if problem[0] is not None:
            raise SaveRefused(f"cannot save step {step}: {problem[0]}")
        with _GuardedWrites(engine) as guard:
            # DeepSpeed's own copies (its zero_to_fp32.py recovery script) bypass the guarded engine;
            # a failure inside it, recorded by the guard, comes first
            outer = _attempt(lambda: engine.save_checkpoint(str(self.dir), tag=tag, client_state=client_state,
                                                            save_latest=False), tag_dir)
            guard.failure = guard.failure or outer
            rng = tag_dir / f"rng_rank{self.rank:05d}.pt"
            guard.write(lambda: torch.save({"torch": torch.get_rng_state()}, rng), rng)
        self._agree(guard.failure, step, tag_dir)  # every rank has written its files, or the save failed
        failure = _attempt(lambda: self._complete(tag_dir, step, client_state, best), tag_dir) if self.rank == 0 else None
        self._agree(failure, step, tag_dir)
        return tag_dir

    def _complete(self, tag_dir: Path, step: int, client_state: dict[str, Any], best: dict[str, Any] | None) -> None:
        """Rank 0, once every rank has written: the run config, the record that makes the checkpoint
        complete, `latest`, best.json, then pruning."""
        atomic_write_text(tag_dir / RUN_CONFIG, json.dumps(client_state["config"], indent=1, sort_keys=True))
        fsync_tree(tag_dir)  # the files are on disk before the record says they are complete
        atomic_write_text(tag_dir / RECORD, json.dumps(checksums(tag_dir), indent=1, sort_keys=True))
        if best is not None:
            self._write_best(tag_dir.name, step, best["val_loss"])
        atomic_write_text(self.dir / "latest", tag_dir.name)
        self._prune()

    def _write_best(self, tag: str, step: int, val_loss: float) -> None:
        atomic_write_text(self.dir / BEST, json.dumps({"tag": tag, "step": step, "val_loss": val_loss}))

    def record_best(self, best: dict[str, Any] | None) -> None:
        """Rank 0, on resume: best.json names the best checkpoint the resumed client state records
        (`best`: {"step", "val_loss"}), where that checkpoint is complete and best.json names another
        (a kill between a new best's record and its best.json left it one best behind)."""
        if self.rank != 0 or best is None:
            return
        tag = f"{TAG_PREFIX}{int(best['step']):08d}"
        if self.best_tag() != tag and (self.dir / tag / RECORD).is_file() and not (self.dir / tag).is_symlink():
            self._write_best(tag, int(best["step"]), float(best["val_loss"]))

    def _agree(self, failure: str | None, step: int, tag_dir: Path) -> None:
        """Collective (it is also the save's barrier): every rank learns whether any rank's writes
        failed; if one did, rank 0 removes the attempt and every rank raises SaveFailed with the first
        failure, naming the newest complete checkpoint, which is untouched."""
        failures = [None] * dist.get_world_size()
        dist.all_gather_object(failures, failure)
        first = next(((rank, f) for rank, f in enumerate(failures) if f is not None), None)
        if first is None:
            return
        if self.rank == 0:
            shutil.rmtree(tag_dir, ignore_errors=True)  # incomplete: invisible anyway, but it holds space
        dist.barrier()
        previous = next((t.name for t in self.tags() if (t / RECORD).is_file()), None)
        raise SaveFailed(f"the checkpoint of step {step} could not be written: rank {first[0]}: {first[1]}. "
                         f"The newest complete checkpoint is {previous or 'none (nothing to resume from)'}; "
                         f"make room or restore write access under {self.dir}, then run again to resume")

    def _prune(self) -> None:
        # a conversion served its resume: this run's own checkpoint is at its layout now
        if (self.dir / UNIVERSAL_DIR).is_dir() and not (self.dir / UNIVERSAL_DIR).is_symlink():
            shutil.rmtree(self.dir / UNIVERSAL_DIR, ignore_errors=True)
        complete = [t for t in self.tags() if (t / RECORD).exists()]
        best = self.best_tag()
        for old in complete[self.keep_last:]:
            if old.name != best:
                shutil.rmtree(old, ignore_errors=True)

    def best_tag(self) -> str | None:
        """The tag best.json names (checkpoint.keep_best), or None: no best.json, or not one of ours
        (a link, a FIFO, malformed: read_best's refusals)."""
        path = self.dir / BEST
        if not path.exists() and not path.is_symlink():
            return None
        try:
            return read_best(path).tag
        except RunFileError:
            return None

    def newest_valid(self) -> str | None:
        """Rank 0 picks the newest verified checkpoint (warning about every one it skips) and checks
        that its files load without code (else every rank raises UntrustedCheckpoint with the file's
        name: a tampered checkpoint stops the run instead of being skipped); all ranks receive the
        same answer."""
        choice = [None, None]
        if self.rank == 0:
            for tag_dir in self.tags():
                problem = verify(tag_dir)
                if problem is None:
                    refusals = [] if self.trust else [r for p in sorted(tag_dir.glob("*.pt")) if (r := scan_pt(p))]
                    choice = [tag_dir.name, refusals[0] if refusals else None]
                    break
                warnings.warn(f"skipping checkpoint {tag_dir}: {problem}", stacklevel=2)
        dist.broadcast_object_list(choice, src=0)
        if choice[1] is not None:
            raise UntrustedCheckpoint(choice[1])
        return choice[0]

    def saved_config(self, tag: str) -> dict[str, Any] | None:
        """The config recorded with checkpoint `tag` (verified with its files; None for checkpoints
        written before the record existed)."""
        path = self.dir / tag / RUN_CONFIG
        if not path.is_file():
            return None
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            raise ValueError(f"{path}: not a readable run config ({type(e).__name__}: {e})") from None
        if not isinstance(saved, dict) or not all(isinstance(v, dict) for v in saved.values()):
            raise ValueError(f"{path}: not a run config (a JSON object of config sections)")
        return saved

    def load(self, engine, tag: str, universal: bool = False) -> dict[str, Any]:
        """Collective: restore engine state and this rank's RNG; returns the client state. Every file
        is read with the restricted unpickler (UntrustedCheckpoint names a file that asks for more).
        With `universal`, the checkpoint was written at another layout: it is loaded through its
        universal conversion (load_universal)."""
        if universal:
            return self.load_universal(engine, tag)
        safe_checkpoint_engine(engine, self.trust)
        _, client_state = engine.load_checkpoint(str(self.dir), tag=tag, load_optimizer_states=True,
                                                 load_lr_scheduler_states=True)
        rng_file = self.dir / tag / f"rng_rank{self.rank:05d}.pt"
        if rng_file.exists():
            torch.set_rng_state(load_pt(rng_file, trust=self.trust)["torch"])
        return client_state

    def load_universal(self, engine, tag: str) -> dict[str, Any]:
        """Collective: rank 0 converts checkpoint `tag` (verified and scanned by newest_valid) into
        DIR/universal/<tag> once, then every rank loads it at this run's layout with DeepSpeed's
        universal loader, which re-partitions the fp32 master weights and Adam moments. Two repairs
        after DeepSpeed's ZeRO-3 loader (0.19.8): each param group's weight decay is kept as this run
        built it (the loader copies group 0's settings into every group), and each state's Adam step
        count is its own tensor again (below). The per-rank RNG files do not carry over to other ranks: none of
        our training draws uses torch's generator (the noise is keyed: rgpt_dist/noise.py)."""
        out = self.dir / UNIVERSAL_DIR / tag
        failure = [None]
        if self.rank == 0:
            try:
                convert(self.dir / tag, out)
            except Exception as e:  # said on every rank, with the checkpoint kept as it was
                failure[0] = f"{type(e).__name__}: {str(e).strip()[:500]}"
        dist.broadcast_object_list(failure, src=0)
        if failure[0] is not None:
            raise ConversionFailed(f"{self.dir / tag} could not be converted to this run's layout: {failure[0]}")
        decay = [group.get("weight_decay") for group in engine.optimizer.param_groups]
        safe_checkpoint_engine(engine, self.trust)
        engine._config.load_universal_checkpoint = True  # read by engine.load_checkpoint at the call
        try:
            with deepspeed_loads_restricted(self.trust):
                _, client_state = engine.load_checkpoint(str(self.dir / UNIVERSAL_DIR), tag=tag,
                                                         load_optimizer_states=True, load_lr_scheduler_states=True)
        finally:
            engine._config.load_universal_checkpoint = False
        for group, wd in zip(engine.optimizer.param_groups, decay):
            group["weight_decay"] = wd
        # DeepSpeed's ZeRO-3 loader gives every sub-group's Adam state the same `step` tensor, which
        # torch's AdamW increments in place: each optimizer step would then advance it once per
        # sub-group, and the bias correction of every step after the resume would be wrong
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
        for state in inner.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()
        return client_state
