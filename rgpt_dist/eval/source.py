"""What rgpt-eval reads: an rgpt-export directory (or its native/ part), or a training checkpoint
(a run directory, its checkpoints/ directory or one step_* directory, consolidated on the fly)."""
from __future__ import annotations

from pathlib import Path

import torch


def load_model(source: str | Path) -> tuple[torch.nn.Module, dict]:
    """(model in eval mode, fp32, on CPU; a record with at least `step` and `data` defaults)."""
    from rgpt_dist.export.native import load_native

    source = Path(source)
    native = source / "native" if (source / "native" / "config.json").is_file() else source
    if (native / "config.json").is_file() and (native / "model.safetensors").is_file():
        return load_native(native)
    from rgpt_dist.export.consolidate import consolidate
    from rgpt_dist.registry import build_model

    c = consolidate(source)
    model = build_model(c.config.model)
    model.load_state_dict(c.state_dict, strict=True)
    return model.eval(), c.record()

