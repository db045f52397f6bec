"""What every Appendix E analysis shares: its inputs (Context), its output (Result), one forward's
per-step trace of the recurrence, per-token exit losses and the figure helper.

    trace(model, x, r):  h[0..r]  (B, T, d)  h[0] = h_pre = h^(0), h[i] the state after step i
                         o[1..r]  (B, T, d)  the shared core's proposal of step i (o[0] is None)
                         g[1..r]  (B, T, d)  the gate of step i (g[0] is None)
    exit_losses(model, h_i, y) -> (B, T) next-token loss of the exit coda + head at state h_i,
                         over the real vocabulary (padded head rows excluded), 0 where y = -1

The model must be a RecurrentGPT with the learned gate, in eval mode (no recurrence noise).
"""
from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from rgpt_dist import strict_json
from rgpt_dist.eval.appendix.diagnostics import capture, figure, label  # noqa: F401 (figure, label: for the analyses)

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclasses.dataclass
class Context:
    """The inputs of an analysis run."""

    model: Any
    """a RecurrentGPT in eval mode, on the batches' device"""
    batches: list[Batch]
    """validation batches (x, y), each (B, T) token ids; targets of -1 are ignored"""
    out: Path
    """directory the analysis writes its NAME.json, NAME.csv and NAME.png into"""
    r: int | None = None
    """depth analysed (default: the model's training depth R = n_loops)"""
    dense: Any = None
    """a dense GPT-2 in eval mode on the same device (E.4 cross-model CKA), or None"""
    prompt: torch.Tensor | None = None
    """(T,) token ids of one prompt (Fig. 4), or None: the first row of the first batch"""
    decode: Callable[[list[int]], str] | None = None
    """token ids -> text, for labels (None: ids are shown)"""

    @property
    def depth(self) -> int:
        return depth(self.model, self.r)


@dataclasses.dataclass
class Result:
    """What an analysis found. `data`: JSON-serialisable once tensors are lists (NaN / inf are written
    as null); `rows` (one dict per row, same keys) become NAME.csv; `summary` holds the report's lines
    (markdown); `figures` its plots. run(ctx) saves it (`save`) beside its plots."""

    name: str
    title: str
    data: dict[str, Any]
    rows: list[dict[str, Any]]
    summary: list[str]
    figures: list[Path] = dataclasses.field(default_factory=list)

    def save(self, out: Path) -> list[Path]:
        """Writes out/NAME.json (data, summary) and out/NAME.csv (rows); returns their paths."""
        out.mkdir(parents=True, exist_ok=True)
        j = out / f"{self.name}.json"
        record = {"title": self.title, "summary": self.summary, **self.data}
        j.write_text(strict_json.dumps(record, indent=1))
        c = out / f"{self.name}.csv"
        with open(c, "w", newline="") as f:
            if self.rows:
                w = csv.DictWriter(f, fieldnames=list(self.rows[0]))
                w.writeheader()
                w.writerows({k: "" if v is None else v for k, v in row.items()} for row in self.rows)
        return [j, c]


def svdvals(w: torch.Tensor) -> torch.Tensor:
    """Singular values of w (m, n), descending, float64; all NaN where w is not finite (LAPACK
    fails to converge on NaN / inf and raises LinAlgError: an undefined spectrum, not a crash)."""
    w = w.double()
    if not bool(torch.isfinite(w).all()):
        return torch.full((min(w.shape),), float("nan"), dtype=torch.float64, device=w.device)
    return torch.linalg.svdvals(w)


def depth(model, r: int | None) -> int:
    """The depth analysed: r, or the model's training depth R = n_loops."""
    return model.cfg.n_loops if r is None else int(r)


def check_model(model, r: int | None) -> int:
    """Refuses what the analyses cannot read (training mode, no gate, r < 1); returns the depth."""
    if model.training:
        raise ValueError("Appendix E analyses need model.eval(): training mode draws recurrence noise")
    if getattr(model.cfg, "gate", "learned") != "learned" or not hasattr(model, "recurrence"):
        raise ValueError("Appendix E analyses need a RecurrentGPT with the learned gate")
    r = depth(model, r)
    if r < 1:
        raise ValueError(f"Appendix E analyses need at least one recurrence step, got r={r}")
    return r


@dataclasses.dataclass
class Trace:
    """One forward's recurrence (shapes in the module docstring) and its final logits (B, T, V_pad)."""

    h: list[torch.Tensor]
    o: list[torch.Tensor | None]
    g: list[torch.Tensor | None]
    logits: torch.Tensor


@torch.no_grad()
def trace(model, x: torch.Tensor, r: int) -> Trace:
    """Runs model(x) at depth r and records every step (hooks removed afterwards)."""
    with capture(model) as rec:
        out = model(x, r=r)
    return Trace(h=rec["h"], o=[None] + rec["o"], g=[None] + rec["g"], logits=out.logits)


def exit_logits(model, h: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits of the exit coda + head at state h, real vocabulary only."""
    logits, _ = model.readout(h)
    return logits[..., : model.cfg.vocab_size]


def exit_losses(model, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token next-token loss (float32) of the exit at state h; 0 where y = -1."""
    logits = exit_logits(model, h).float()
    losses = F.cross_entropy(logits.flatten(0, 1), y.clamp(min=0).flatten(), reduction="none")
    return losses.view_as(y) * (y != -1)


def save_figure(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def fmt(v: float | None) -> str:
    """A number for the report's tables: 4 significant digits, '-' where undefined."""
    return "-" if v is None else f"{v:.4g}"

