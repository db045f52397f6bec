"""Whether a model's weights are finite: every evaluation report of a model whose weights hold NaN or
inf says so (its losses and statistics are undefined, not a finding; docs/security.md)."""
from __future__ import annotations

import torch


def nonfinite_weights(model: torch.nn.Module) -> str | None:
    """None when every parameter and buffer is finite, else a sentence naming them ("the weights are
    not finite: 2 of 31 tensors hold NaN or inf (a.weight, b.bias)"). Every report of a model whose
    weights are not finite says so: its losses and statistics are undefined, not a finding."""
    tensors = [(name, t) for name, t in (*model.named_parameters(), *model.named_buffers())
               if t.is_floating_point()]
    bad = [name for name, t in tensors if not bool(torch.isfinite(t).all())]
    if not bad:
        return None
    names = ", ".join(bad[:5]) + (f", ... ({len(bad) - 5} more)" if len(bad) > 5 else "")
    return f"the weights are not finite: {len(bad)} of {len(tensors)} tensors hold NaN or inf ({names})"
