"""The block options the shared layers read from a model config (docs/models.md): the normalisation
(`norm`), the MLP's width (`mlp`, `d_ff`) and width-muP's multiplier (`mup_base_width`). Each reader
accepts a config from before its field (an older export's config.json: the GPT-2 default) and
refuses a value ModelConfig.problems would refuse, for a hand-edited config.json that reaches the
layers without it. Plain PyTorch, shipped with the layers in remote-code exports."""
from __future__ import annotations

import math
from typing import Any

import torch.nn as nn

NORMS, MLPS = ("layernorm", "rmsnorm"), ("gelu", "swiglu")  # as rgpt_dist.models.config


def _choice(cfg: Any, name: str, default: str, allowed: tuple[str, ...]) -> str:
    """cfg.<name>, `default` for a config from before the field (an older export's config.json); an
    unknown value (a hand-edited config.json) is refused as ModelConfig.problems does."""
    value = getattr(cfg, name, default)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")
    return value


def layer_norm(cfg: Any) -> nn.Module:
    """The model's normalisation over d (cfg.norm): GPT-2's LayerNorm (bias per cfg.bias) or RMSNorm
    (a gain, never a bias: x / sqrt(mean(x^2) + eps) * weight), both with eps = cfg.ln_eps."""
    if _choice(cfg, "norm", "layernorm", NORMS) == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.ln_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps, bias=cfg.bias)


def mlp_kind(cfg: Any) -> str:
    """cfg.mlp: `gelu` (also for a config from before the field) or `swiglu`."""
    return _choice(cfg, "mlp", "gelu", MLPS)


def ffn_width(cfg: Any) -> int:
    """The MLP's hidden width: cfg.d_ff, or 4 d for gelu when it is 0 (swiglu needs it given)."""
    d_ff = getattr(cfg, "d_ff", 0)
    if d_ff == 0 and mlp_kind(cfg) == "gelu":
        return 4 * cfg.d_model
    if isinstance(d_ff, bool) or not isinstance(d_ff, int) or d_ff < 1:
        raise ValueError(f"d_ff={d_ff!r} must be an integer >= 1 (0 means 4 d_model, for mlp='gelu' only)")
    return d_ff


def mup_width_mult(cfg: Any) -> float | None:
    """muP's width multiplier m = d_model / cfg.mup_base_width, or None without muP (0: standard
    parametrisation, bitwise; docs/models.md)."""
    base = getattr(cfg, "mup_base_width", 0)
    if isinstance(base, bool) or not isinstance(base, int) or base < 0:
        raise ValueError(f"mup_base_width={base!r} must be an integer >= 0")
    return cfg.d_model / base if base else None


def mup_hidden_std(cfg: Any, std: float) -> float:
    """A hidden matrix's init std under muP: std / sqrt(m) (std itself without muP)."""
    m = mup_width_mult(cfg)
    return std if m is None else std / math.sqrt(m)


def mark_hidden(module: nn.Module, cfg: Any) -> None:
    """Tag a module whose matrices are muP's hidden weights: rgpt_dist.train.optim gives every >= 2-D
    parameter under it the learning rate lr x mup_lr_scale (1 / m); None without muP or at m = 1."""
    m = mup_width_mult(cfg)
    module.mup_lr_scale = None if m is None or m == 1 else 1.0 / m  # m = 1: standard parametrisation
