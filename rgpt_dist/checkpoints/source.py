"""What rgpt-eval reads: an rgpt-export directory (or its native/ part), or a training checkpoint
(a run directory, its checkpoints/ directory or one step_* directory, consolidated on the fly)."""
from __future__ import annotations

from pathlib import Path

import torch

from rgpt_dist.checkpoints.consolidate import consolidate
from rgpt_dist.checkpoints.native import load_native
from rgpt_dist.registry import build_model


def load_model(source: str | Path, trust: bool = False) -> tuple[torch.nn.Module, dict]:
    """(model in eval mode, fp32, on CPU; a record with at least `step` and `data` defaults).
    Exports are safetensors; checkpoints are read without running code unless trust=True (UNSAFE)."""

    source = Path(source)
    native = source / "native" if (source / "native" / "config.json").is_file() else source
    if (native / "config.json").is_file() and (native / "model.safetensors").is_file():
        model, record = load_native(native)
        return model, _resolve_data(record, source)

    c = consolidate(source, trust=trust)
    model = build_model(c.config.model)
    model.load_state_dict(c.state_dict, strict=True)
    return model.eval(), _resolve_data(c.record(), source)


def _resolve_data(record: dict, base: Path) -> dict:
    """The record with relative dataset paths resolved against the export or run it came from (the
    trainer records absolute paths; a relative one must not name something in the reader's current
    directory)."""
    data = record.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("paths"), list):
        return {**record, "data": {}}
    paths = [p if "://" in p or Path(p).is_absolute() else str(base.resolve() / p)
             for p in data["paths"] if isinstance(p, str)]
    return {**record, "data": {**data, "paths": paths}}

