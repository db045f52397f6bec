"""The training input pipeline: mosaicml-streaming over rgpt-prep's MDS datasets.

Each sample is seq_len + 1 uint16 tokens; the dataset returns (inputs, targets) int64 tensors shifted
by one. Ranks read disjoint samples (streaming partitions by the RANK / WORLD_SIZE / LOCAL_WORLD_SIZE
environment that torchrun and deepspeed set); the loader's `state_dict()` / `load_state_dict()`
resume mid-epoch exactly. What holds when resuming on a different number of ranks is documented in
docs/data.md. Every index is checked before a shard is read (rgpt_dist.data.index: token columns only,
shard names inside the split directory); remote datasets are cached in a private per-user directory
(rgpt_dist.data.cache).
"""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rgpt_dist.data.cache import cache_dir as private_cache
from rgpt_dist.data.index import DatasetError, check_split
from rgpt_dist.data.mds import import_streaming

streaming = import_streaming()


class SafeStream(streaming.Stream):
    """A Stream whose index (downloaded, for a remote one) is checked before any shard is fetched,
    decompressed or read."""

    def get_shards(self, world, allow_unsafe_types: bool):  # type: ignore[override]
        shards = super().get_shards(world, allow_unsafe_types=False)  # reads index.json only
        check_split(Path(self.local) / (self.split or ""), local=self.remote is None)
        return shards


class TokenDataset(streaming.StreamingDataset):
    """(inputs, targets) = (tokens[:-1], tokens[1:]) as int64 tensors of length seq_len."""

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        tokens = torch.from_numpy(np.asarray(super().__getitem__(idx)["tokens"], dtype=np.int64))
        return tokens[:-1], tokens[1:]


def _stream(root: str, split: str, cache_dir: str | None) -> Any:
    """A local dataset directory, or a remote URI (s3://, gs://, ...) cached in a private directory
    (cache_dir, or a per-user one under the temp directory)."""
    if "://" in root:
        if ".." in Path(root.split("://", 1)[1]).parts:
            raise DatasetError(f"{root}: a dataset URI with `..` would be cached outside the cache directory")
        local = private_cache("streaming", cache_dir) / root.replace("://", "/") / split
        return SafeStream(remote=f"{root.rstrip('/')}/{split}", local=str(local))
    path = Path(root) / split
    shards = check_split(path)
    if not sum(s["samples"] for s in shards):
        raise DatasetError(f"{path} holds no samples (too little text for one sample, or val_fraction 0); "
                           f"see {Path(root) / 'manifest.json'}")
    return SafeStream(local=str(path))


def token_dataset(roots: str | list[str], split: str = "train", *, batch_size: int, shuffle: bool = True,
                  seed: int = 1337, cache_dir: str | None = None, num_canonical_nodes: int | None = None,
                  **kwargs: Any) -> TokenDataset:
    """A dataset over one or more rgpt-prep outputs (their `split` subdirectories).

    batch_size is the per-rank micro-batch (streaming needs it for exact resumption);
    num_canonical_nodes fixes the global sample order independently of the number of ranks.
    """
    roots = [roots] if isinstance(roots, (str, Path)) else list(roots)
    streams = [_stream(str(r), split, cache_dir) for r in roots]
    return TokenDataset(streams=streams, batch_size=batch_size, shuffle=shuffle, shuffle_seed=seed,
                        num_canonical_nodes=num_canonical_nodes or 1, **kwargs)


def token_loader(dataset: TokenDataset, batch_size: int, num_workers: int = 0) -> Any:
    """A resumable loader yielding (inputs, targets) of shape (batch_size, seq_len)."""
    return streaming.StreamingDataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                         drop_last=True, persistent_workers=False)


def cleanup_stale_state() -> None:
    """Remove what killed or finished runs leave behind: streaming's stale shared-memory segments and
    its lock files in the temp directory that no live process holds. Contains a barrier when a
    process group exists: call it on every rank or on none."""
    import fcntl
    import tempfile

    from streaming.base.util import clean_stale_shared_memory

    for attempt in range(3):  # a dying process's resource tracker may unlink a segment under us
        try:
            clean_stale_shared_memory()
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    for lock in glob.glob(os.path.join(tempfile.gettempdir(), "[0-9]" * 6 + "_*_filelock")):
        try:
            with open(lock, "a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by a live run: leave it
                os.remove(lock)
        except OSError:
            pass
