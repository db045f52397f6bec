"""The project's own export format: `model.safetensors` (full tp = 1 parameter names) and
`config.json` (the model section, the training step and where the weights came from). Loading it
needs only rgpt_dist; rgpt-eval reads it, or a training checkpoint directly."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rgpt_dist.config import ModelConfig, from_dict
from rgpt_dist.registry import build_model

FORMAT = "rgpt-dist/native/1"


def write_native(sd: dict[str, torch.Tensor], cfg: ModelConfig, out_dir: Path, dtype: torch.dtype,
                 meta: dict) -> None:

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(dtype).contiguous() for k, v in sd.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": FORMAT})
    record = {"format": FORMAT, "model": cfg.to_dict(), "dtype": str(dtype).removeprefix("torch."), **meta}
    (out_dir / "config.json").write_text(json.dumps(record, indent=2) + "\n")


def load_native(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, dict]:
    """(model in eval mode, the config.json record) from a native export directory."""

    path = Path(path)
    try:
        record = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(f"{path}/config.json unreadable: {e}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("model"), dict):
        raise ValueError(f"{path}/config.json is not an rgpt-dist native export (format {FORMAT}, a model section)")
    cfg = from_dict(ModelConfig, record["model"])
    problems = cfg.problems("model")
    if problems:
        raise ValueError(f"{path}/config.json: invalid model: {'; '.join(problems[:5])}")
    with torch.device("meta"):
        model = build_model(cfg)
    try:  # safetensors: tensors only, never code
        sd = load_file(str(path / "model.safetensors"))
        model.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True, assign=True)
    except Exception as e:  # a damaged file, or tensors that do not fit the config
        raise ValueError(f"{path}/model.safetensors does not load into its config's model: {str(e)[:300]}") from None
    return model.eval(), record
