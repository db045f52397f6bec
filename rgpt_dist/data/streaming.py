"""The training input pipeline: mosaicml-streaming over rgpt-prep's MDS datasets.

Each sample is seq_len + 1 uint16 tokens; the dataset returns (inputs, targets) int64 tensors shifted
by one. Ranks read disjoint samples (streaming partitions by the RANK / WORLD_SIZE / LOCAL_WORLD_SIZE
environment that torchrun and deepspeed set); the loader's `state_dict()` / `load_state_dict()`
resume mid-epoch exactly. What holds when resuming on a different number of ranks is documented in
docs/data.md. Every index is checked before a shard is read (rgpt_dist.data.index: token columns only,
shard names inside the split directory); remote datasets are cached in a private per-user directory
(rgpt_dist.data.cache), their shards checked as they arrive (SafeStream), and a download that fails
after streaming's retries raises RemoteDataError (rgpt_dist.data.uri) instead of streaming's silent
short epoch. Opening a dataset takes a host-wide lock around streaming's shared-memory
registration (host_registration_lock).
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist

from rgpt_dist.data.cache import cache_dir as private_cache
from rgpt_dist.data.index import DatasetError, check_split
from rgpt_dist.data.mds import import_streaming
from rgpt_dist.data.uri import RemoteDataError, described, endpoint, is_remote, uri_problem
from rgpt_dist.data.verify import check_shard_data, map_file

streaming = import_streaming()
from streaming.base.dataset import _ShardState as ShardState  # noqa: E402  (private: the shard states' enum)


class SafeStream(streaming.Stream):
    """A Stream whose index (downloaded, for a remote one) is checked before any shard is fetched,
    decompressed or read, and, for a remote one, whose shards are checked as they arrive in the
    cache and when a run finds them there (rgpt_dist.data.verify: offsets, token ids below
    `vocab_size`), before streaming reads them. A download that still fails after streaming's
    retries becomes a RemoteDataError naming the shard and the endpoint."""

    vocab_size: int | None = None  # set by token_dataset: the token-id bound of the shard check
    failure: BaseException | None = None  # the first error of a shard download (in any thread)

    def get_shards(self, world, allow_unsafe_types: bool):  # type: ignore[override]
        shards = super().get_shards(world, allow_unsafe_types=False)  # reads index.json only
        check_split(Path(self.local) / (self.split or ""), local=self.remote is None)
        return shards

    def _raw(self, shard) -> Path:
        return Path(self.local) / (self.split or "") / shard.file_pairs[0][0].basename

    def _check_cached(self, shard, i: int | None = None) -> None:
        """A downloaded shard as streaming will read it; a bad one is removed from the cache (a
        rerun fetches it again) and refused with its URI."""
        raw, name = self._raw(shard), shard.file_pairs[0][0].basename
        where = f"{self.remote}/{name} (cached as {raw}{'' if i is None else f', shard {i}'})"
        try:
            check_shard_data(map_file(raw), shard.samples, shard.column_sizes[0] // 2, self.vocab_size, where)
        except DatasetError:
            raw.unlink(missing_ok=True)
            raise

    def set_up_local(self, shards, cache_usage_per_shard) -> None:  # type: ignore[override]
        """streaming's inventory of the cache (on each node's local leader), then every cached shard
        checked: a damaged one (a disk error, a hand edit) is removed and fetched again, checked on
        arrival, rather than read or refused (the remote copy is the dataset)."""
        super().set_up_local(shards, cache_usage_per_shard)
        if self.remote is None:
            return  # a local split was checked whole by the preflight
        for i, shard in enumerate(shards):
            if cache_usage_per_shard[i] and self._raw(shard).is_file():
                try:
                    self._check_cached(shard, i)
                except DatasetError as e:
                    print(f"warning: {e}: removed from the cache, fetching it again", file=sys.stderr, flush=True)
                    cache_usage_per_shard[i] = 0

    def prepare_shard(self, shard) -> int:  # type: ignore[override]
        if self.remote is None:
            return super().prepare_shard(shard)
        try:
            delta = super().prepare_shard(shard)  # download (streaming's retries), decompress
        except Exception as e:
            name = shard.file_pairs[0][1 if shard.compression else 0].basename
            err = RemoteDataError(f"could not fetch {self.remote}/{name} from {endpoint(self.remote)} "
                                  f"({self.download_retry} attempts, {self.download_timeout:g} s each): {described(e)}")
            self.failure = self.failure or err
            raise err from e
        try:
            self._check_cached(shard)
        except DatasetError as e:
            self.failure = self.failure or e
            raise
        return delta


class TokenDataset(streaming.StreamingDataset):
    """(inputs, targets) = (tokens[:-1], tokens[1:]) as int64 tensors of length seq_len."""

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        tokens = torch.from_numpy(np.asarray(super().__getitem__(idx)["tokens"], dtype=np.int64))
        return tokens[:-1], tokens[1:]

    def __iter__(self):  # type: ignore[override]
        """streaming's iteration, raising a failed download as itself. streaming's download thread
        failing ends the epoch early without an error (the next epoch raises 'Background thread
        failed. Check other traceback.'): a short epoch is never taken for a whole one here."""
        try:
            yield from super().__iter__()
        except Exception as e:
            failure = self._failure()
            if failure is None or failure is e:
                raise
            raise failure from e
        if (failure := self._failure()) is not None:
            raise failure

    def _prepare_thread(self, it) -> None:  # type: ignore[override]
        _noting_exit(super()._prepare_thread, it)

    def _ready_thread(self, it) -> None:  # type: ignore[override]
        _noting_exit(super()._ready_thread, it)

    def _failure(self) -> BaseException | None:
        return next((s.failure for s in self.streams if getattr(s, "failure", None)), None)

    def prepare_shard(self, shard_id: int, blocking: bool = True) -> None:  # type: ignore[override]
        try:
            super().prepare_shard(shard_id, blocking)
        except BaseException:
            # the shard stays PREPARING otherwise, and a reader waiting for it would wait forever
            self._shard_states[shard_id] = ShardState.REMOTE
            raise


def _noting_exit(thread_body, it) -> None:
    """streaming's download threads skip their exit note when they fail, and the next epoch's start
    waits for that note forever: give it, then fail as before."""
    try:
        thread_body(it)
    except BaseException:
        it.on_exit()
        raise


def _stream(root: str, split: str, cache_dir: str | None, download_retry: int, download_timeout: float) -> Any:
    """A local dataset directory, or a remote URI (s3://, gs://, ...) cached in a private directory
    (cache_dir, or a per-user one under the temp directory)."""
    if is_remote(root):
        if problem := uri_problem(root):
            raise DatasetError(f"{root}: {problem}")
        local = cached_split(root, split, cache_dir)
        return SafeStream(remote=f"{root.rstrip('/')}/{split}", local=str(local), download_retry=download_retry,
                          download_timeout=download_timeout)
    path = Path(root) / split
    shards = check_split(path)
    if not sum(s["samples"] for s in shards):
        raise DatasetError(f"{path} holds no samples (too little text for one sample, or val_fraction 0); "
                           f"see {Path(root) / 'manifest.json'}")
    return SafeStream(local=str(path))


def cached_split(root: str, split: str, cache_dir: str | None) -> Path:
    """Where a remote split is cached: the private cache, then the URI's path."""
    return private_cache("streaming", cache_dir) / root.replace("://", "/") / split


def fetch_index(root: str, split: str, timeout: float, cache_dir: str | None = None) -> list[dict[str, Any]]:
    """The checked shard records of a remote split's index.json, fetched into a temporary directory:
    the preflight of a remote dataset (its shards are checked as they arrive: SafeStream). A cached
    index that differs from it is refused: the dataset was replaced at its prefix, and the cache's
    shards, keyed by name, may be the old dataset's."""
    uri = f"{root.rstrip('/')}/{split}/index.json"
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / split / "index.json"
        try:
            streaming.base.storage.CloudDownloader.direct_download(uri, str(local), timeout)
        except Exception as e:
            raise RemoteDataError(f"could not fetch {uri} from {endpoint(uri)}: {described(e)}") from e
        shards = check_split(local.parent, local=False)
        cached = cached_split(root, split, cache_dir)
        if (cached / "index.json").is_file() and (cached / "index.json").read_bytes() != local.read_bytes():
            raise DatasetError(f"{cached}: the cache holds another version of {root.rstrip('/')}/{split} (the "
                               f"dataset was replaced at its prefix): remove {cached}, or give data.cache_dir "
                               "a fresh directory")
        return shards


def token_dataset(roots: str | list[str], split: str = "train", *, batch_size: int, shuffle: bool = True,
                  seed: int = 1337, cache_dir: str | None = None, num_canonical_nodes: int | None = None,
                  vocab_size: int | None = None, download_retry: int = 2, download_timeout: float = 60.0,
                  **kwargs: Any) -> TokenDataset:
    """A dataset over one or more rgpt-prep outputs (their `split` subdirectories).

    batch_size is the per-rank micro-batch (streaming needs it for exact resumption);
    num_canonical_nodes fixes the global sample order independently of the number of ranks;
    vocab_size bounds the token ids of remote shards as they arrive (a local split is checked by the
    trainer's preflight); kwargs go to StreamingDataset (replication, predownload, cache_limit).
    """
    roots = [roots] if isinstance(roots, (str, Path)) else list(roots)
    streams = [_stream(str(r), split, cache_dir, download_retry, download_timeout) for r in roots]
    for stream in streams:
        stream.vocab_size = vocab_size
    with host_registration_lock():
        return TokenDataset(streams=streams, batch_size=batch_size, shuffle=shuffle, shuffle_seed=seed,
                            num_canonical_nodes=num_canonical_nodes or 1, **kwargs)


# One per host: a file in /dev/shm itself, whose names it guards (a node with a private /dev/shm mount
# gets its own lock even where nodes share /tmp; a lock shared across nodes would deadlock, since a
# leader holds it through a collective barrier).
REGISTRATION_LOCK = "rgpt-dist-streaming-registration.lock"


@contextlib.contextmanager
def host_registration_lock(wait_notice_s: float = 30.0) -> Iterator[None]:
    """Serialize streaming's shared-memory registration between the jobs of one host.

    A StreamingDataset registers itself under the first free prefix of /dev/shm (`000000_locals`,
    ...); two jobs on one host (a shared SLURM node, `rgpt-compare --jobs 2`) that open a dataset at
    the same moment find the same free prefix and one dies with FileExistsError. The local leader
    holds this lock from before any rank of its job searches (the barrier) until its dataset is
    registered. Call it on every rank or on none, like the constructor it wraps."""
    world = streaming.base.world.World.detect()
    fd = None
    if world.is_local_leader:
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        path = os.path.join(shm, REGISTRATION_LOCK)
        # read-only: flock needs no write access, so users sharing a node share the file; no symlinks
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        start, told = time.monotonic(), False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told and time.monotonic() - start > wait_notice_s:
                    print(f"rgpt-dist: waiting for {path}, held by another job on this host that is "
                          "opening its dataset", file=sys.stderr, flush=True)
                    told = True
                time.sleep(0.05)
    try:
        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # no rank of this job looks for a free prefix before its leader holds the lock
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def token_loader(dataset: TokenDataset, batch_size: int, num_workers: int = 0) -> Any:
    """A resumable loader yielding (inputs, targets) of shape (batch_size, seq_len)."""
    return streaming.StreamingDataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                         drop_last=True, persistent_workers=False)


SEGMENT = re.compile(r"[0-9]{6}_(%s)" % "|".join(streaming.base.constant.SHM_TO_CLEAN))
"""streaming's shared-memory segments in /dev/shm: <the dataset's prefix, 6 digits>_<what it holds>."""


def cleanup_stale_state() -> None:
    """Remove what killed or finished runs left behind, and nothing a live run uses: streaming's
    shared-memory segments that no process on this host maps or holds open, and its lock files in the
    temp directory that no process holds. (streaming's own clean_stale_shared_memory() removes every
    segment, a live job's too: that job then dies with FileExistsError at its next registration.) The
    segments are checked under the host's registration lock, so no job registers meanwhile. Contains a
    barrier when a process group exists: call it on every rank or on none."""
    with host_registration_lock():
        if streaming.base.world.World.detect().is_local_leader and os.path.isdir("/dev/shm"):
            in_use = _segments_in_use()
            for name in os.listdir("/dev/shm"):
                if SEGMENT.fullmatch(name) and name not in in_use:
                    with contextlib.suppress(OSError):  # another user's, or gone meanwhile
                        os.unlink(os.path.join("/dev/shm", name))
    for lock in glob.glob(os.path.join(tempfile.gettempdir(), "[0-9]" * 6 + "_*_filelock")):
        try:
            with open(lock, "a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by a live run: leave it
                os.remove(lock)
        except OSError:
            pass


def _segments_in_use() -> set[str]:
    """The /dev/shm names some process on this host maps (/proc/PID/maps) or holds open (/proc/PID/fd).
    A process this user may not inspect is another user's, and so are its segments."""
    names = set()
    for proc in glob.glob("/proc/[0-9]*"):
        with contextlib.suppress(OSError):  # exited meanwhile, or not ours
            with open(os.path.join(proc, "maps")) as maps:
                names.update(line.split("/dev/shm/", 1)[1].split()[0] for line in maps if "/dev/shm/" in line)
        with contextlib.suppress(OSError):
            for fd in os.listdir(os.path.join(proc, "fd")):
                with contextlib.suppress(OSError):
                    target = os.readlink(os.path.join(proc, "fd", fd))
                    if target.startswith("/dev/shm/"):
                        names.add(target[len("/dev/shm/"):].split()[0])
    return names
