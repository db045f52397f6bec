"""mosaicml-streaming access: a safe import, the token-sample MDS format, and index merging.

`import streaming` imports `streaming.vision`, which imports torchvision; PyPI's torchvision cannot
load beside a CPU build of torch. When torchvision is unusable a stub `streaming.vision` module is
installed first (the project uses only token samples, never vision datasets).
"""
from __future__ import annotations

import importlib.util
import logging
import sys
import types
from pathlib import Path


def import_streaming():
    """`import streaming`, working around an unusable torchvision; returns the module."""
    if "streaming" in sys.modules:
        return sys.modules["streaming"]
    usable = False
    if importlib.util.find_spec("torchvision") is not None:
        try:
            import torchvision  # noqa: F401
            usable = True
        except Exception:  # RuntimeError: operator torchvision::nms does not exist, and similar
            sys.modules.pop("torchvision", None)
    if not usable:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


def token_column(n_tokens: int) -> dict[str, str]:
    """The one MDS column of a token dataset: `tokens`, n_tokens uint16 values per sample."""
    return {"tokens": f"ndarray:uint16:{n_tokens}"}


def mds_writer(out: str | Path, n_tokens: int, shard_mb: float, compression: str | None = None):
    streaming = import_streaming()
    return streaming.MDSWriter(out=str(out), columns=token_column(n_tokens),
                               size_limit=int(shard_mb * 2**20), compression=compression)


def merge_split_index(split_dir: str | Path, part_names: list[str]) -> None:
    """Write split_dir/index.json covering the shards of split_dir/<part>/index.json, in part order."""
    import_streaming()
    from streaming.base.util import merge_index

    logging.getLogger("root").setLevel(logging.ERROR)  # merge_index warns about its temp folder
    merge_index([str(Path(split_dir) / p / "index.json") for p in part_names], str(split_dir))
