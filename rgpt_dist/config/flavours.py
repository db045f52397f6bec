"""The registry of named model sizes (paper Table 1 and CPU-sized debug flavours).

This dict is the single source of truth; `configs/models/<name>.yaml` mirrors it (a test checks
they agree) and is rewritten by `make configs`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_SCALES = {"small": (768, 12), "medium": (1024, 16), "large": (1280, 20)}


def _gpt2(scale: str, n_layer: int) -> dict[str, Any]:
    d, h = _SCALES[scale]
    return {"family": "gpt2", "d_model": d, "n_head": h, "n_layer": n_layer}


def _rgpt(scale: str, n_pre: int, n_rec: int, r: int, n_coda: int) -> dict[str, Any]:
    d, h = _SCALES[scale]
    return {"family": "recurrent_gpt", "d_model": d, "n_head": h,
            "n_pre": n_pre, "n_rec": n_rec, "n_loops": r, "n_coda": n_coda}


_DEBUG = {"d_model": 64, "n_head": 4}

FLAVOURS: dict[str, dict[str, Any]] = {
    "gpt2-small": _gpt2("small", 12),
    "gpt2-medium": _gpt2("medium", 24),
    "gpt2-large": _gpt2("large", 36),
    "recurrentgpt-small-isoflops": _rgpt("small", 1, 1, 10, 1),
    "recurrentgpt-medium-isoflops": _rgpt("medium", 2, 5, 4, 2),
    "recurrentgpt-large-isoflops": _rgpt("large", 1, 5, 6, 5),
    "recurrentgpt-medium-isoparams": _rgpt("medium", 2, 20, 4, 2),
    "recurrentgpt-large-isoparams": _rgpt("large", 3, 30, 6, 3),
    # CPU-sized pair: 1+1x2+1 executes 4 blocks per token, like the 4-layer dense debug model.
    "gpt2-debug": {"family": "gpt2", **_DEBUG, "n_layer": 4},
    "recurrentgpt-debug": {"family": "recurrent_gpt", **_DEBUG, "n_pre": 1, "n_rec": 1, "n_loops": 2, "n_coda": 1},
}

# The dense baseline each recurrent cell is compared against (isoFLOPs: same block executions;
# isoParams: same unique blocks).
DENSE_REFERENCE: dict[str, str] = {
    "recurrentgpt-small-isoflops": "gpt2-small",
    "recurrentgpt-medium-isoflops": "gpt2-medium",
    "recurrentgpt-large-isoflops": "gpt2-large",
    "recurrentgpt-medium-isoparams": "gpt2-medium",
    "recurrentgpt-large-isoparams": "gpt2-large",
    "recurrentgpt-debug": "gpt2-debug",
}


def flavour(name: str) -> dict[str, Any]:
    """The model-section dict of a named flavour (a copy); unknown names list the known ones."""
    from rgpt_dist.config.base import ConfigError

    if name not in FLAVOURS:
        raise ConfigError(f"model={name!r} is not a known flavour (known: {', '.join(FLAVOURS)})")
    return dict(FLAVOURS[name])


def write_yaml(directory: str | Path) -> list[Path]:
    """Write one YAML per flavour (the full model section, defaults included)."""
    from rgpt_dist.config.base import from_dict
    from rgpt_dist.config.model import ModelConfig

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in FLAVOURS.items():
        cfg = from_dict(ModelConfig, data, "model")
        path = directory / f"{name}.yaml"
        header = f"# Model flavour {name}: generated from rgpt_dist/config/flavours.py, do not edit.\n"
        path.write_text(header + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        written.append(path)
    return written
