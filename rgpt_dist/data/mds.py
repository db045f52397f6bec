"""mosaicml-streaming access: a safe import, the token-sample MDS format, and index merging
(reading samples without a streaming dataset: rgpt_dist.data.samples).

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



def import_streaming():
    """`import streaming`, working around an unusable torchvision; returns the module."""
    if "streaming" in sys.modules:
        return sys.modules["streaming"]
    usable = False
    if importlib.util.find_spec("torchvision") is not None:
        try:
            import torchvision  # noqa: F401  (only to learn whether it loads beside this torch)
            usable = True
        except Exception:  # RuntimeError: operator torchvision::nms does not exist, and similar
            sys.modules.pop("torchvision", None)
    for unused in ("streaming.text", "streaming.multimodal", *(() if usable else ("streaming.vision",))):
        sys.modules.setdefault(unused, types.ModuleType(unused))
    stand_ins = {} if "transformers" in sys.modules else _transformers_stand_ins()
    sys.modules.update(stand_ins)
    try:
        import streaming  # here, with the stand-ins above in place
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


def merge_split_index(split_dir: str | Path, part_names: list[str]) -> None:
    """Write split_dir/index.json covering the shards of split_dir/<part>/index.json, in part order."""
    merge_index = import_streaming().base.util.merge_index
    logging.getLogger("root").setLevel(logging.ERROR)  # merge_index warns about its temp folder
    merge_index([str(Path(split_dir) / p / "index.json") for p in part_names], str(split_dir))
