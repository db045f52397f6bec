"""Appendix E of the RecurrentGPT paper: the recurrence-dynamics analyses, one module each.

Every analysis module exposes

    NAME:  str                       file stem of its outputs (NAME.json, NAME.csv, NAME.png)
    TITLE: str                       the report's section title, with the paper's section number
    NEEDS: tuple[str, ...]           Context fields it needs besides model and batches ("dense", "prompt")
    run(ctx: Context) -> Result      computes, writes NAME.json, NAME.csv (Result.save) and its plots
                                     into ctx.out, returns the Result

and reads the model only through `rgpt_dist.eval.appendix.common` (per-step trace, exits) and the
model's public modules (recurrence, readout). `rgpt-eval diagnostics --all` runs every analysis in
ANALYSES order and writes report.md / report.html (rgpt_dist.eval.appendix.report). No
torch.distributed: the analyses run on one process, on a checkpoint or an export.
"""
from __future__ import annotations

import importlib
from types import ModuleType

# report order = the paper's order; name (= NAME, the file stem) -> module rgpt_dist.eval.appendix.<module>
ANALYSES: dict[str, str] = {
    "diagnostics": "steps",                # E.1/E.2/E.4 (within)/E.6 (delta): rgpt_dist.eval.appendix.diagnostics
    "forced_gate": "forced_gate",          # E.1 gate = 0 / gate = 1, and depths beyond R
    "update_dynamics": "update_dynamics",  # E.3 proposal / applied-update norms, cosines, gain
    "dense_cka": "dense_cka",              # E.4 CKA against a dense model's layers
    "difficulty": "difficulty",            # E.5 loss and gate by token-difficulty decile
    "effective_rank": "effective_rank",    # E.6 effective rank of the state and of the late deltas
    "gate_attribution": "gate_attribution",  # E.7 gradient x input of the gate logit, W_x / W_h spectra
    "projection": "projection",            # E.8 the two W_proj halves
    "attention": "attention",              # E.9 attention entropy, diagonal / previous-token mass, head classes
    "frequency": "frequency",              # E.10 token-frequency bands
    "top_tokens": "top_tokens",            # Fig. 4 per-step top-token probabilities for a prompt
}


def analysis(name: str) -> ModuleType:
    """The module of analysis `name` (a key of ANALYSES)."""
    if name not in ANALYSES:
        raise ValueError(f"unknown analysis {name!r}; choose from {', '.join(ANALYSES)}")
    return importlib.import_module(f"{__name__}.{ANALYSES[name]}")
