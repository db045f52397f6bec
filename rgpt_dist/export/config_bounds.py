"""The sizes a remote-code export's config.json asks for, bounded by the weights on disk.

Under --remote-code auto an export's shipped code runs when it is byte-identical to this checkout's
(rgpt_dist.export.remote_code), but its config.json is still the export's own: the trusted code builds
whatever model the config describes before a weight is read, so a config asking for 300,000 layers or
d_model = 2^22 would allocate without bound. `check_config_bounds` runs before transformers
instantiates anything. It reads config.json and only the JSON header of the weights file (the 8-byte
length and the header, at most 100 MiB as the safetensors format itself allows; never tensor data),
and refuses (ConfigBoundsRefused, naming config.json, the field and what the weights hold):

1. model fields (every field of the family's config class found in config.json, listed in native_fields
   or not: RGPTConfig hands both to the model) of the wrong type;
2. more transformer blocks (n_layer; n_pre + n_rec + n_coda; n_enc + n_dec) than the weights hold tensors
   (every block has at least one of its own);
3. a d_model or padded vocabulary other than model.embed.wte's shape (every family that ships code
   has that token embedding);
4. values outside the family's own bounds (ModelConfig.problems: e.g. n_layer <= 1024, d_ff <= 2^18,
   block_size <= 2^20, the only bound on block_size where positions are not learned);
5. num_hidden_layers other than the blocks per token rgpt-export writes (a family without a depth keeps
   the config.json value, which other tools size per-layer structures by);
6. any tensor of the model the config describes (built on the meta device: shapes, no memory; its size
   is bounded by 2-4 first) that the weights lack or hold with another shape; a module list that is
   longer than the weights' (blocks.N) is named with the field whose value its length is.
Tensors the weights hold beyond the model's are not refused (they allocate nothing).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import torch

from rgpt_dist.config import ConfigError, ModelConfig, from_dict
from rgpt_dist.models.spec import families
from rgpt_dist.registry import build_model

MAX_HEADER = 100 * 2**20
"""Bytes of a safetensors JSON header read at most (the safetensors library's own limit)."""
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
               "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
"""Bytes per element of the safetensors dtypes: a tensor's shape must account for exactly its data bytes."""
EMBEDDING = "model.embed.wte.weight"
BLOCK_FIELDS = ("n_layer", "n_pre", "n_rec", "n_coda", "n_enc", "n_dec")
"""Fields that count transformer blocks (spec.unique_blocks sums those of the family)."""
_LIST_ITEM = re.compile(r"^(.*?)\.(\d+)\.")


class ConfigBoundsRefused(ValueError):
    """A remote-code export whose config.json asks for sizes its weights do not hold."""


def weight_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from a safetensors file's header alone; ConfigBoundsRefused for a file that
    is not one (a header longer than the file or than MAX_HEADER, not a JSON object of tensors) or whose
    header claims a shape its data does not hold (data_offsets outside the file, or spanning other than
    shape x dtype bytes): the shapes returned are backed by bytes on disk."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 2 <= n <= min(MAX_HEADER, size - 8):
                raise ConfigBoundsRefused(f"{path} is not a safetensors file (header length {n}, file of {size} "
                                          f"bytes, at most {MAX_HEADER} header bytes)")
            header = json.loads(f.read(n))
    except (OSError, ValueError, RecursionError) as e:
        if isinstance(e, ConfigBoundsRefused):
            raise
        raise ConfigBoundsRefused(f"{path}: unreadable safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise ConfigBoundsRefused(f"{path}: the safetensors header is not a JSON object")
    shapes, data = {}, size - 8 - n
    integers = lambda v, k: isinstance(v, list) and (k is None or len(v) == k) and all(  # noqa: E731
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v)
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        entry = entry if isinstance(entry, dict) else {}
        shape, offsets, dtype = entry.get("shape"), entry.get("data_offsets"), entry.get("dtype")
        if not integers(shape, None) or not integers(offsets, 2) or dtype not in DTYPE_BYTES:
            raise ConfigBoundsRefused(f"{path}: tensor {name!r} has no valid shape, data_offsets and dtype in the header")
        need = math.prod(shape) * DTYPE_BYTES[dtype]
        if not offsets[0] <= offsets[1] <= data or offsets[1] - offsets[0] != need:
            raise ConfigBoundsRefused(f"{path}: tensor {name!r} of shape {shape} ({dtype}: {need} bytes) has data_offsets "
                                      f"{offsets}, not that many bytes within the file's {data} bytes of data")
        shapes[name] = tuple(shape)
    return shapes


def _weights(hf_dir: Path) -> tuple[str, dict[str, tuple[int, ...]]]:
    """(the weights files' description for messages, their tensors' shapes)."""
    single = hf_dir / "model.safetensors"
    files = [single] if single.is_file() else sorted(hf_dir.glob("model-*-of-*.safetensors"))
    if not files:
        raise ConfigBoundsRefused(f"{hf_dir} holds no model.safetensors: nothing bounds the sizes config.json asks for")
    shapes = {}
    for f in files:
        shapes.update(weight_shapes(f))
    return (files[0].name if len(files) == 1 else f"{len(files)} weight shards"), shapes


def _fields_equal_to(cfg: ModelConfig, value: int) -> list[str]:
    names = [f for f, v in vars(cfg).items() if isinstance(v, int) and not isinstance(v, bool) and v == value]
    names += [p for p in ("padded_vocab_size", "ffn_width", "head_dim") if getattr(cfg, p, None) == value]
    return names


def check_config_bounds(hf_dir: str | Path) -> None:
    """ConfigBoundsRefused unless every size hf_dir/config.json asks for is what the weights on disk need
    (module docstring); reads no tensor data and instantiates nothing but meta tensors."""
    hf_dir = Path(hf_dir)
    where = f"{hf_dir}/config.json"
    try:
        config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise ConfigBoundsRefused(f"{where} unreadable: {e}") from None
    spec = families().get(config.get("family")) if isinstance(config, dict) and isinstance(config.get("family"), str) \
        else None
    if spec is None:
        raise ConfigBoundsRefused(f"{where}: family {config.get('family') if isinstance(config, dict) else None!r} "
                                  "is not a family of this checkout")
    names = {f.name for f in dataclasses.fields(spec.config) if f.init}
    try:  # 1. types
        cfg = from_dict(ModelConfig, {k: v for k, v in config.items() if k in names})
    except ConfigError as e:
        raise ConfigBoundsRefused(f"{where}: {'; '.join(e.problems[:5])}") from None
    weights, shapes = _weights(hf_dir)
    what = f"{hf_dir}/{weights}"
    blocks = spec.unique_blocks(cfg)  # 2. blocks <= tensors
    if isinstance(blocks, int) and blocks > len(shapes):
        counted = ", ".join(f"{f} = {getattr(cfg, f)}" for f in BLOCK_FIELDS if hasattr(cfg, f))
        raise ConfigBoundsRefused(f"{where} asks for {blocks} transformer blocks ({counted}) but {what} holds "
                                  f"{len(shapes)} tensors in all (every block has at least one of its own)")
    wte = shapes.get(EMBEDDING)  # 3. the embedding's shape
    if wte is None or len(wte) != 2:
        raise ConfigBoundsRefused(f"{what} holds no 2-D {EMBEDDING} (shape {wte}): nothing bounds the width and "
                                  f"vocabulary {where} asks for")
    if cfg.d_model != wte[1]:
        raise ConfigBoundsRefused(f"{where} asks for d_model = {cfg.d_model}, but {EMBEDDING} in {what} has shape "
                                  f"{list(wte)}: the weights hold width {wte[1]}")
    if cfg.padded_vocab_size != wte[0]:
        raise ConfigBoundsRefused(f"{where} asks for vocab_size = {cfg.vocab_size} (pad_vocab_multiple = "
                                  f"{cfg.pad_vocab_multiple}: {cfg.padded_vocab_size} embedding rows), but {EMBEDDING} "
                                  f"in {what} has shape {list(wte)}: the weights hold {wte[0]} rows")
    problems = cfg.problems("config.json")  # 4. the family's bounds
    if problems:
        raise ConfigBoundsRefused(f"{where}: {'; '.join(p.replace('config.json.', '') for p in problems[:5])}")
    if not spec.recurrent:  # 5. a family without a depth keeps config.json's num_hidden_layers
        layers = int(spec.block_executions(cfg))
        if config.get("num_hidden_layers") != layers:
            raise ConfigBoundsRefused(f"{where} asks for num_hidden_layers = {config.get('num_hidden_layers')!r}; "
                                      f"the model its fields describe (and whose weights {what} holds) runs "
                                      f"{layers} blocks per token")
    try:  # 6. every tensor of the described model, against the weights
        with torch.device("meta"):
            expected = {f"model.{k}": tuple(v.shape) for k, v in build_model(cfg).state_dict().items()}
    except Exception as e:  # noqa: BLE001 - a config the family's model cannot be built from
        raise ConfigBoundsRefused(f"{where}: the {cfg.family} model it describes cannot be built: {e}") from None
    _compare(cfg, expected, shapes, where, what)


def _compare(cfg: ModelConfig, expected: dict, shapes: dict, where: str, what: str) -> None:
    lists: dict[str, set[str]] = {}
    for name in shapes:
        m = _LIST_ITEM.match(name)
        if m:
            lists.setdefault(m[1], set()).add(m[2])
    for name in sorted({m[1] for m in map(_LIST_ITEM.match, expected) if m}):
        want = len({m[2] for m in map(_LIST_ITEM.match, expected) if m and m[1] == name})
        have = len(lists.get(name, ()))
        if want > have:
            equal = _fields_equal_to(cfg, want)
            fields = ", ".join(f"{f} = {want}" for f in [f for f in equal if f in BLOCK_FIELDS] or equal) or "its fields"
            raise ConfigBoundsRefused(f"{where} asks for {want} {name}.N ({fields}) but {what} holds {have}")
    missing = sorted(set(expected) - set(shapes))
    if missing:
        raise ConfigBoundsRefused(f"{where} describes a {cfg.family} model with {len(missing)} tensors {what} does "
                                  f"not hold: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    for name in sorted(expected):
        want, have = expected[name], shapes[name]
        if want != have:
            dims = {w for w, h in zip(want, have) if w != h} if len(want) == len(have) else set(want)
            fields = sorted({f for d in dims for f in _fields_equal_to(cfg, d)})
            named = f" ({', '.join(f'{f} = {getattr(cfg, f)}' for f in fields)})" if fields else ""
            raise ConfigBoundsRefused(f"{where} asks for {name} of shape {list(want)}{named}, but {what} holds it "
                                      f"with shape {list(have)}")
