"""Strict JSON for every file rgpt-eval writes: NaN and +-inf become null (Python's json writes bare
`NaN` / `Infinity`, which strict parsers -- JavaScript, jq, most non-Python readers -- reject), and
numpy / torch scalars and tensors become numbers and lists. No torch import (rgpt-eval grid has none).

A NaN in a report means "undefined here"; each writer says so in its own text (e.g. "weights are not
finite"), the JSON only carries null."""
from __future__ import annotations

import json
import math
from typing import Any


def finite(v: Any) -> Any:
    """v with NaN / inf as None, tensors and arrays as lists, numpy / torch scalars as numbers."""
    if hasattr(v, "tolist") and callable(v.tolist) and not isinstance(v, (str, bytes)):
        v = v.tolist()  # torch / numpy tensors, arrays and scalars
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps of finite(obj) with allow_nan=False (a non-finite value left over is a bug: raise)."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)
