"""A training checkpoint -> one full-precision, tp = 1 state dict and the run's config.

Checkpoints are DeepSpeed tag directories (rgpt_dist.train.checkpoint): per tensor-parallel rank t a
`*mp_rank_{t:02d}_model_states.pt` (module weights in the training dtype, the client state with the
resolved config) and, under ZeRO 1-3 or bf16, one `*_optim_states.pt` per data-parallel rank holding
a flat shard of the fp32 master weights. Consolidation takes the fp32 masters where they exist (through
DeepSpeed's own zero_to_fp32 reader, one tensor-parallel rank at a time, since that reader assumes a
single model-parallel rank) and the module weights otherwise, then merges the tp shards with the
layout the model definition requests (rgpt_dist.parallel.reshard).

Nothing in a checkpoint runs code: every file is read with the restricted unpickler
(rgpt_dist.safe_load; DeepSpeed's reader too), unless the caller passes trust=True. A checkpoint that
cannot be read, or whose contents do not fit the model its config names, raises ExportError with the
file and the reason.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import tempfile
from pathlib import Path

import torch

from rgpt_dist.config import Config, from_dict
from rgpt_dist.parallel.reshard import layout_for, merge_state_dicts
from rgpt_dist.safe_load import UntrustedCheckpoint, load_pt, restricted_loads
from rgpt_dist.checkpoints.record import TAG_PREFIX, verify
from rgpt_dist.registry import build_model


class ExportError(RuntimeError):
    """A checkpoint that cannot be exported, with the reason."""


@dataclasses.dataclass
class Consolidated:
    state_dict: dict[str, torch.Tensor]  # full tp = 1 names and shapes, fp32
    config: Config
    step: int
    tag_dir: Path
    source: str  # "fp32 master weights (ZeRO-n)" or "module weights (dtype)"

    def record(self) -> dict:
        """Where the weights came from and the run's data defaults: export.json and rgpt-eval use it."""
        data = self.config.data
        return {"checkpoint": str(self.tag_dir.resolve()), "step": self.step, "weights": self.source,
                "data": {"paths": list(data.paths), "val_split": data.val_split, "seq_len": self.config.train.seq_len}}


def find_tag_dir(path: str | Path) -> Path:
    """A run directory, a checkpoint directory or a tag directory -> the tag directory to export:
    the newest complete, verified one (an explicitly named tag must itself verify)."""
    path = Path(path)
    if not path.exists():
        raise ExportError(f"{path} does not exist")
    if not path.is_dir():
        raise ExportError(f"{path} is not a directory (give a run, checkpoints/ or step_* directory)")
    if path.name.startswith(TAG_PREFIX):
        candidates = [path]
    else:
        root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        candidates = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith(TAG_PREFIX)), reverse=True)
        if not candidates:
            raise ExportError(f"no checkpoint ({TAG_PREFIX}*) under {root}")
    problems = []
    for tag_dir in candidates:
        problem = verify(tag_dir)
        if problem is None:
            return tag_dir
        problems.append(f"{tag_dir.name}: {problem}")
    raise ExportError(f"no complete checkpoint to export: {'; '.join(problems)}")


def _mp_files(tag_dir: Path, tp_rank: int, kind: str) -> list[Path]:
    pattern = re.compile(rf"(^|_)mp_rank_{tp_rank:02d}_{kind}\.pt$")
    return sorted(p for p in tag_dir.iterdir() if pattern.search(p.name))


def _load(path: Path, trust: bool) -> dict:
    state = load_pt(path, trust=trust)
    if not isinstance(state, dict) or not isinstance(state.get("module"), dict):
        raise ExportError(f"{path} is not a DeepSpeed model-states file (no `module` state dict)")
    return state


def _fp32_masters(tag_dir: Path, tp_rank: int, trust: bool) -> dict[str, torch.Tensor] | None:
    """DeepSpeed's zero_to_fp32 over this tensor-parallel rank's files only (it globs a directory,
    so they are linked into a private one); None when the checkpoint holds no ZeRO/bf16 partitions."""
    optim = _mp_files(tag_dir, tp_rank, "optim_states")
    if not optim:
        return None
    from deepspeed.utils import zero_to_fp32  # DeepSpeed (slow, picks its accelerator) only for ZeRO-3 shards

    with tempfile.TemporaryDirectory() as tmp:
        for f in optim + _mp_files(tag_dir, tp_rank, "model_states"):
            os.symlink(f.resolve(), Path(tmp) / f.name)
        quiet = contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO())  # progress bars
        with quiet[0], quiet[1], restricted_loads(zero_to_fp32, trust):
            state = zero_to_fp32._get_fp32_state_dict_from_zero_checkpoint(tmp, exclude_frozen_parameters=False)
        return {k: v.detach().float().clone() for k, v in zero_to_fp32.to_torch_tensor(state).items()}


def _rank_state(tag_dir: Path, tp_rank: int, trust: bool) -> tuple[dict[str, torch.Tensor], dict, str]:
    model_files = _mp_files(tag_dir, tp_rank, "model_states")
    if not model_files:
        raise ExportError(f"{tag_dir} has no model states for tensor-parallel rank {tp_rank}")
    first = _load(model_files[0], trust)
    masters = _fp32_masters(tag_dir, tp_rank, trust)
    if masters is not None:
        return masters, first, "fp32 master weights"
    module = {k: v.float() for k, v in first["module"].items()}
    dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in first["module"].values()})
    return module, first, f"module weights ({', '.join(dtypes)})"


def consolidate(path: str | Path, trust: bool = False) -> Consolidated:
    """The newest complete checkpoint under `path` as a full fp32 state dict for the tp = 1 model.
    trust=True (UNSAFE) lets files that need full unpickling load."""
    tag_dir = find_tag_dir(path)
    try:
        return _consolidate(tag_dir, trust)
    except ExportError:
        raise
    except UntrustedCheckpoint as e:
        raise ExportError(str(e)) from None
    except Exception as e:  # verified files whose contents are not what their names say (crafted, or a bug)
        raise ExportError(f"{tag_dir}: cannot consolidate ({type(e).__name__}: {str(e)[:300]})") from None


def _consolidate(tag_dir: Path, trust: bool) -> Consolidated:
    state, client, source = _rank_state(tag_dir, 0, trust)
    if not isinstance(client.get("config"), dict):
        raise ExportError(f"{tag_dir} holds no run config (not written by rgpt-dist's trainer?)")
    cfg = from_dict(Config, client["config"])
    problems = cfg.problems()  # sizes a crafted config could make absurd are bounded there
    if problems:
        raise ExportError(f"{tag_dir}: the run config it holds is invalid: {'; '.join(problems[:5])}")
    tp = cfg.parallel.tp_size
    shards = [state] + [_rank_state(tag_dir, t, trust)[0] for t in range(1, tp)]
    layout = layout_for(cfg.model)
    unknown = sorted(set(shards[0]) - set(layout))
    if unknown:
        raise ExportError(f"{tag_dir} holds parameters the {cfg.model.family} model does not have: {unknown[:3]}")
    try:
        full = merge_state_dicts(shards, layout) if tp > 1 else {k: shards[0][k] for k in layout}
    except KeyError as e:
        raise ExportError(f"{tag_dir} lacks parameters of the {cfg.model.family} model: {e}") from None
    _check_shapes(full, cfg, tag_dir)
    stage = cfg.parallel.zero_stage
    return Consolidated(full, cfg, int(client.get("step", 0)), tag_dir,
                        f"{source} (ZeRO-{stage}, tp={tp}, {cfg.parallel.dtype})")


def _check_shapes(full: dict[str, torch.Tensor], cfg: Config, tag_dir: Path) -> None:
    """Exactly the config's model's parameter names, each with its shape (the model built on the meta
    device: no memory)."""

    with torch.device("meta"):
        expected = build_model(cfg.model).state_dict()
    bad = [f"{k} missing" for k in sorted(set(expected) - set(full))]
    bad += [f"{k} not in the model" for k in sorted(set(full) - set(expected))]
    bad += [f"{k}: {tuple(v.shape)} != {tuple(expected[k].shape)}" for k, v in full.items()
            if k in expected and (not isinstance(v, torch.Tensor) or v.shape != expected[k].shape)]
    if bad:
        raise ExportError(f"{tag_dir}: parameters do not fit the {cfg.model.family} model: {'; '.join(bad[:3])}")
