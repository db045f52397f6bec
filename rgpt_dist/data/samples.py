"""The first samples of a split in file order, read without a streaming dataset: no process group,
no shared memory (evaluation, and the tests' float64 replays of a run)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rgpt_dist.data.index import DatasetError, check_split
from rgpt_dist.data.mds import import_streaming
from rgpt_dist.data.verify import check_shard_data, map_file


def read_token_samples(split_dir: str | Path, limit: int, scratch: str | Path,
                       vocab_size: int | None = None) -> list[np.ndarray]:
    """The first `limit` samples of a split in file order, each (seq_len + 1,) uint16, without a
    process group or shared memory (evaluation). The index is checked first
    (rgpt_dist.data.index); compressed shards are decompressed into `scratch` (a private directory),
    never into the dataset, and must decompress to their recorded size. Each shard read is checked
    whole first (rgpt_dist.data.verify: its offsets table, and with vocab_size every token id)."""
    streaming = import_streaming()
    decompress, MDSReader = streaming.base.compression.decompress, streaming.base.format.mds.reader.MDSReader

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
