"""checkpoint.init_from: a run whose weights start from another run's (Ouro's stage II from its
stage I, a fine-tune), read as rgpt-eval reads a model: a training checkpoint consolidated without
running code, or an rgpt-export. Only the weights: the optimizer, schedule and step start afresh."""
from __future__ import annotations

from pathlib import Path

import torch

from rgpt_dist.checkpoints.consolidate import ExportError, find_tag_dir
from rgpt_dist.checkpoints.source import load_model
from rgpt_dist.train.checkpoint import CheckpointManager


class InitFromMismatch(ValueError):
    """The source's weights are not this model's (another family or shape), or cannot be read;
    raised on every rank alike, before anything is written."""


def wanted(cfg) -> bool:
    """checkpoint.init_from is set and the run has no checkpoint of its own to resume from (a tag
    directory: whether it verifies is the resume's business)."""

    if not cfg.checkpoint.init_from:
        return False
    own = Path(cfg.checkpoint.dir or Path(cfg.log.run_dir) / "checkpoints")
    return not (cfg.checkpoint.resume and CheckpointManager(own, 1, 0).tags())


def source_problem(source: str) -> str | None:
    """Preflight's cheap check: None when `source` names a complete checkpoint or a native export."""

    path = Path(source)
    if (path / "config.json").is_file() or (path / "native" / "config.json").is_file():
        return None
    try:
        find_tag_dir(path)
    except ExportError as e:
        return f"checkpoint.init_from={source!r}: {e}"
    return None


def load_initial_weights(model: torch.nn.Module, source: str) -> None:
    """Copies the source's weights into the freshly built model (tp = 1, before sharding and the
    engine). Every name and shape must agree: a mismatch names the first few and changes nothing."""

    try:
        theirs = load_model(source)[0].state_dict()
    except (ExportError, ValueError, OSError) as e:
        raise InitFromMismatch(f"checkpoint.init_from={source!r}: {e}") from None
    ours = model.state_dict()
    problems = [f"{k} missing from the source" for k in ours if k not in theirs]
    problems += [f"{k} is not in this model" for k in theirs if k not in ours]
    problems += [f"{k}: source {tuple(theirs[k].shape)}, this model {tuple(v.shape)}"
                 for k, v in ours.items() if k in theirs and theirs[k].shape != v.shape]
    if problems:
        shown = "; ".join(problems[:4]) + (f" (and {len(problems) - 4} more)" if len(problems) > 4 else "")
        raise InitFromMismatch(f"checkpoint.init_from={source!r} holds another model's weights: {shown}")
    with torch.no_grad():
        for k, v in ours.items():
            v.copy_(theirs[k])
