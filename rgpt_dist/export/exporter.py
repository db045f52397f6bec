"""A training checkpoint -> an export directory, written whole or not at all:

    OUT/native/   model.safetensors + config.json (rgpt-dist's own format, rgpt_dist.export.native)
    OUT/hf/       a Hugging Face model directory with the GPT-2 tokenizer files:
                  dense GPT-2 as a native GPT2LMHeadModel, RecurrentGPT as trust_remote_code
    OUT/export.json  where it came from (checkpoint, step, weights source, checksum record)
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

from rgpt_dist.durable import swap_dir
from rgpt_dist.export.consolidate import ExportError, consolidate
from rgpt_dist.export.native import write_native
from rgpt_dist.export.tokenizer_files import write_tokenizer
from rgpt_dist.models.spec import spec_for

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def export(checkpoint: str | Path, out: str | Path, *, overwrite: bool = False, dtype: str = "fp32",
           inference: dict | None = None, trust: bool = False) -> Path:
    """Consolidate the newest complete checkpoint under `checkpoint` and write OUT (see module doc).
    `inference`: settings the HF config carries for the family (RecurrentGPT: r_eval, kv_strategy).
    trust=True (UNSAFE) loads checkpoint files that need full unpickling. OUT is replaced (with
    --overwrite) in one exchange: it always holds either the old export or the new one."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise ExportError(f"{out} exists: pass --overwrite to replace it")
    if dtype not in DTYPES:
        raise ExportError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}")
    c = consolidate(checkpoint, trust=trust)  # names and shapes already checked against the model
    meta = {**c.record(),
            "checksums_sha256": hashlib.sha256((c.tag_dir / "checksums.json").read_bytes()).hexdigest()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write_native(c.state_dict, c.config.model, tmp / "native", DTYPES[dtype], meta)
        spec_for(c.config.model).write_hf(c.state_dict, c.config.model, tmp / "hf", dtype=DTYPES[dtype],
                                          **(inference or {}))
        write_tokenizer(tmp / "hf", model_max_length=c.config.model.block_size)
        (tmp / "export.json").write_text(json.dumps({**meta, "dtype": dtype, "inference": inference or {}}, indent=2))
        swap_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
