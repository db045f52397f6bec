"""The ablation tables (issue #15) from the grid summary's rows (rgpt_dist.eval.grid.summarize): the
runs of rgpt_dist.studies.ablation.grid laid out like the paper's Fig. 5 and Table 7 (each row beside the
row it adds a component to, and beside the dense baseline) and like its sensitivity tables (each
setting beside the default). Rows the main grid trains (`REUSED`) are read from its runs. The
ablation study (rgpt_dist.studies.ablation.report) writes them with its bar chart. No torch.
"""
from __future__ import annotations

import statistics
from typing import Any

from rgpt_dist.studies.ablation.grid import SMALL
from rgpt_dist.markdown import cell, code

SMALL_RUN, DENSE_SMALL_RUN = f"{SMALL}-20k", "gpt2-small-20k"
# study -> (title, kind, the runs of the main grid it includes as rows: row label -> run name)
STUDIES: dict[str, tuple[str, str, dict[str, str]]] = {
    "fig5": ("Fig. 5: sequential component ablation (small cell, 20k steps)", "sequential",
             {"1-dense": DENSE_SMALL_RUN, "6-gate": SMALL_RUN}),
    "table7": ("Table 7: sequential component ablation (medium cell, 2k steps)", "sequential", {}),
    "b4": ("B.4: gate temperature tau (medium cell, 5k steps; default tau1)", "sweep", {}),
    "b5": ("B.5: state noise sigma_x (medium cell, 5k steps; default sigma0.1 = b4's tau1)", "sweep",
           {"sigma0.1": "ablation-b4-tau1"}),
    "b6": ("B.6: gate bias and state noise at the full horizon (small cell, 20k steps)", "sweep",
           {"default": SMALL_RUN}),
    "b1": ("B.1: seeds (small cell, 20k steps)", "seeds", {"seed1337-recurrentgpt": SMALL_RUN,
                                                            "seed1337-dense": DENSE_SMALL_RUN}),
}
DEFAULTS = {"b4": "tau1", "b5": "sigma0.1", "b6": "default"}


def study_rows(rows: list[dict[str, Any]], study: str) -> list[tuple[str, dict[str, Any]]]:
    """(row label, grid row) of one study, in row order: its ablation runs and the reused ones."""
    by_name = {r["name"]: r for r in rows}
    prefix = f"ablation-{study}-"
    found = {r["name"].removeprefix(prefix): r for r in rows if r["name"].startswith(prefix)}
    found.update({label: by_name[name] for label, name in STUDIES[study][2].items() if name in by_name})
    return sorted(found.items(), key=lambda item: _row_key(item[0]))


def _row_key(label: str) -> tuple:
    """Fig. 5's '4b-noise-at-init' after '4-state-noise'; sweeps by their value."""
    head = label.split("-")[0]
    digits = head.rstrip("abcdefghijklmnopqrstuvwxyz")
    return (int(digits), head) if digits.isdigit() else (float("inf"), label)


def _delta(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a - b:+.4f}"


def _loss(r: dict[str, Any]) -> str:
    return "-" if r["val_loss"] is None else f"{r['val_loss']:.4f}"


def sequential(found: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each row's delta against the row it builds on (the last main row: '4b' is an alternative to
    '4', so both compare with '3') and against the dense baseline (row 1)."""
    main = {int(label.split("-")[0]): r for label, r in found if label.split("-")[0].isdigit()}
    dense = main.get(1)
    out = ["| row | run | layout | val loss | Δ vs previous row | Δ vs dense | status |", "|---|---|---|---|---|---|---|"]
    for label, r in found:
        number = _row_key(label)[0]
        previous = main[max(n for n in main if n < number)] if any(n < number for n in main) else None
        step = _delta(r["val_loss"], previous["val_loss"]) if previous else "-"
        out.append(f"| {cell(label)} | {code(r['name'])} | {cell(r['layout'])} | {_loss(r)} | {step} | "
                   f"{_delta(r['val_loss'], dense['val_loss']) if dense and r is not dense else '-'} | "
                   f"{cell(r['status'])} |")
    return out


def sweep(found: list[tuple[str, dict[str, Any]]], default: str) -> list[str]:
    base = dict(found).get(default)
    out = ["| setting | run | val loss | Δ vs default | status |", "|---|---|---|---|---|"]
    for label, r in found:
        out.append(f"| {cell(label)} | {code(r['name'])} | {_loss(r)} | "
                   f"{_delta(r['val_loss'], base['val_loss']) if base else '-'} | {cell(r['status'])} |")
    return out


def seeds(found: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Mean and sample standard deviation of each model's finished seeds."""
    out = ["| model | seeds | val losses | mean | std |", "|---|---|---|---|---|"]
    for model in ("recurrentgpt", "dense"):
        runs = [(label.split("-")[0], r["val_loss"]) for label, r in found if label.endswith(model) and r["val_loss"]]
        values = [v for _, v in runs]
        std = f"{statistics.stdev(values):.4f}" if len(values) > 1 else "-"
        mean = f"{statistics.mean(values):.4f}" if values else "-"
        out.append(f"| {model} | {cell(', '.join(s for s, _ in runs) or '-')} | "
                   f"{', '.join(f'{v:.4f}' for v in values) or '-'} | {mean} | {std} |")
    return out


def markdown(rows: list[dict[str, Any]]) -> str | None:
    """ablations.md, or None when no ablation run is among `rows`."""
    if not any(r["name"].startswith("ablation-") for r in rows):
        return None
    out = ["# Ablations (the paper's section 5 and Appendix B)", "",
           "Val loss at the end of each run; Δ in nats. Rows the main grid trains are its runs.", ""]
    for study, (title, kind, _) in STUDIES.items():
        found = study_rows(rows, study)
        if not found:
            continue
        table = sequential(found) if kind == "sequential" else seeds(found) if kind == "seeds" \
            else sweep(found, DEFAULTS[study])
        out += [f"## {title}", "", *table, ""]
    return "\n".join(out)
