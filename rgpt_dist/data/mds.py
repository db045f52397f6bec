"""mosaicml-streaming access: a safe import, the token-sample MDS format, and index merging.

`import streaming` imports its dataset converters: `streaming.vision` imports torchvision, which
PyPI cannot load beside a CPU build of torch, and `streaming.text` and `streaming.multimodal` import
transformers' tokenizers and scikit-learn, 4.7 of the 5.9 s the import takes on one core, paid by
every rank of every launch. The project uses only token samples (MDSWriter, StreamingDataset, the
MDS reader), never those converters, so empty stand-ins for them are installed first (the vision one
only where torchvision is unusable); a converter imported before this still wins. Its data loader
also imports transformers (1.6 s per process) for two classes it names in one isinstance check on
batches of those types, which this project's loaders never yield: unless transformers is already
loaded, that import sees stand-in classes, and the stand-in modules are removed again at once, so a
later `import transformers` loads the real package.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
import types
from pathlib import Path

import numpy as np


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
    for unused in ("streaming.text", "streaming.multimodal", *(() if usable else ("streaming.vision",))):
        sys.modules.setdefault(unused, types.ModuleType(unused))
    stand_ins = {} if "transformers" in sys.modules else _transformers_stand_ins()
    sys.modules.update(stand_ins)
    try:
        import streaming
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
    return streaming


def _transformers_stand_ins() -> dict[str, types.ModuleType]:
    """The two transformers classes streaming.base.dataloader imports (for `isinstance(batch, ...)`),
    as empty classes in modules of the same names."""
    out = {"transformers": types.ModuleType("transformers")}
    for module, cls in (("feature_extraction_utils", "BatchFeature"), ("tokenization_utils_base", "BatchEncoding")):
        name = f"transformers.{module}"
        out[name] = types.ModuleType(name)
        setattr(out[name], cls, type(cls, (), {"__module__": name}))
    return out


def token_column(n_tokens: int) -> dict[str, str]:
    """The one MDS column of a token dataset: `tokens`, n_tokens uint16 values per sample."""
    return {"tokens": f"ndarray:uint16:{n_tokens}"}


def mds_writer(out: str | Path, n_tokens: int, shard_mb: float, compression: str | None = None):
    streaming = import_streaming()
    return streaming.MDSWriter(out=str(out), columns=token_column(n_tokens),
                               size_limit=int(shard_mb * 2**20), compression=compression)


def read_token_samples(split_dir: str | Path, limit: int, scratch: str | Path,
                       vocab_size: int | None = None) -> list[np.ndarray]:
    """The first `limit` samples of a split in file order, each (seq_len + 1,) uint16, without a
    process group or shared memory (evaluation). The index is checked first
    (rgpt_dist.data.index); compressed shards are decompressed into `scratch` (a private directory),
    never into the dataset, and must decompress to their recorded size. Each shard read is checked
    whole first (rgpt_dist.data.verify: its offsets table, and with vocab_size every token id)."""
    from rgpt_dist.data.index import DatasetError, check_split
    from rgpt_dist.data.verify import check_shard_data, map_file

    import_streaming()
    from streaming.base.compression import decompress
    from streaming.base.format.mds.reader import MDSReader

    split_dir, out = Path(split_dir), []
    for i, info in enumerate(check_split(split_dir)):
        if len(out) >= limit:
            break
        reader, where = MDSReader.from_json(str(split_dir), "", info), f"{split_dir / 'index.json'} shard {i}"
        if info["compression"] is not None:
            raw = decompress(info["compression"], (split_dir / info["zip_data"]["basename"]).read_bytes())
            if len(raw) != info["raw_data"]["bytes"]:
                raise DatasetError(f"{where}: decompresses to {len(raw)} bytes, not {info['raw_data']['bytes']}")
            local = Path(scratch) / f"shard{i}.mds"
            local.write_bytes(raw)
            reader = MDSReader.from_json(str(scratch), "", {**info, "raw_data": {**info["raw_data"], "basename": local.name}})
        n_tokens = info["column_sizes"][0] // 2
        shard = Path(reader.dirname, reader.split, reader.raw_data.basename)
        check_shard_data(map_file(shard), info["samples"], n_tokens, vocab_size, f"{where} ({shard})")
        for j in range(min(info["samples"], limit - len(out))):
            try:
                tokens = np.asarray(reader.get_item(j)["tokens"])
            except (ValueError, IndexError, OverflowError) as e:  # offsets past the file, a truncated sample
                raise DatasetError(f"{where}: sample {j} unreadable ({e})") from None
            if tokens.shape != (n_tokens,):
                raise DatasetError(f"{where}: sample {j} holds {tokens.size} tokens, not {n_tokens}")
            out.append(tokens)
    return out


def merge_split_index(split_dir: str | Path, part_names: list[str]) -> None:
    """Write split_dir/index.json covering the shards of split_dir/<part>/index.json, in part order."""
    import_streaming()
    from streaming.base.util import merge_index

    logging.getLogger("root").setLevel(logging.ERROR)  # merge_index warns about its temp folder
    merge_index([str(Path(split_dir) / p / "index.json") for p in part_names], str(split_dir))
