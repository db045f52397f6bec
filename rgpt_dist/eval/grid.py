"""The grid summary (issue #7): one row per training run in the paper's Table 1 layout.

`summarize(runs_dir)` reads each run directory (config.yaml, the resolved config the trainer wrote, and
metrics.jsonl) and never raises on a broken run: `status` finished | running | failed-or-incomplete,
`progress` steps done / max_steps, `problem` (file:line for a corrupt record). Parameters and FLOPs come
from rgpt_dist.flops on the run's own config (Eq. 1 at R with its seq_len; training at E[r]); the paper's
numbers sit beside them where the run's cell (its name without the budget) is one of Table 1's.
`write_table(rows, out_dir)` writes grid.md (per regime, scale and budget: the dense baseline, then the
recurrent runs with their val-loss delta against it), grid.csv and grid.json. No torch import.
"""
from __future__ import annotations

import csv
import json
import re
import time
from pathlib import Path
from typing import Any

from rgpt_dist.config import FLAVOURS, load_config
from rgpt_dist import strict_json
from rgpt_dist import markdown as mdtext
from rgpt_dist.flops import compute_flags, report
from rgpt_dist.models.spec import families, spec_for

FINISHED, RUNNING, FAILED = "finished", "running", "failed-or-incomplete"
SCALES = ("small", "medium", "large", "debug")
SETTINGS = {"isoflops": "isoFLOPs", "isoparams": "isoParams"}
STANDARD_STEPS = 20000
_SCALE_BY_WIDTH = {FLAVOURS[f"gpt2-{s}"]["d_model"]: s for s in ("small", "medium", "large")}


def paper_val_loss() -> dict[str, float]:
    """Paper Table 1 validation losses (standard 20k budget) by flavour, from the family specs."""
    return {k: v for spec in families().values() for k, v in spec.paper_val_loss.items()}


COLUMNS = ["name", "cell", "scale", "setting", "method", "family", "budget", "max_steps", "layout", "unique_blocks",
           "params", "params_no_embedding", "seq_len", "fwd_flops_per_token", "head_flops_per_token", "expected_r",
           "train_flops_per_token", "tokens_per_step", "train_flops_total", "status", "progress", "steps_done",
           "tokens_seen", "train_flops_done", "train_loss", "val_loss", "val_step", "early_exit", "early_exit_str",
           "dense_run", "delta_vs_dense", "fwd_ratio_to_dense", "train_ratio_to_dense", "paper_params", "paper_params_note", "paper_flops_fwd",
           "paper_val_loss", "last_checkpoint", "problem", "flags", "run_dir"]


def summarize(runs_dir: str | Path, stale_after_s: float | None = 3600.0) -> list[dict[str, Any]]:
    """One row per run directory under runs_dir (or runs_dir itself when it is a run), in grid order.
    A subdirectory is a run when it holds config.yaml, metrics.jsonl or checkpoints/. An unfinished
    run with nothing written for stale_after_s seconds is failed-or-incomplete (None: never)."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise FileNotFoundError(f"{runs_dir} is not a directory")
    dirs = [runs_dir] if _is_run(runs_dir) else sorted(p for p in runs_dir.iterdir() if p.is_dir() and _is_run(p))
    rows = [_summarize_or_fail(d, stale_after_s) for d in dirs]
    _add_dense_comparison(rows)
    return sorted(rows, key=_order)


def _summarize_or_fail(run_dir: Path, stale_after_s: float | None) -> dict[str, Any]:
    """summarize_run, or a failed row naming the error: whatever one run directory holds, the grid
    of the others is still written (summarize_run checks what it reads; this is the last guard)."""
    try:
        return summarize_run(run_dir, stale_after_s)
    except (OSError, ValueError, TypeError, KeyError, ArithmeticError, RecursionError) as e:
        row = {k: None for k in COLUMNS}
        row.update(name=run_dir.name, cell=run_dir.name, run_dir=str(run_dir), status=FAILED, progress="?",
                   problem=f"{run_dir}: unreadable run ({type(e).__name__}: {str(e)[:300]})")
        return row


def _is_run(path: Path) -> bool:
    return any((path / n).exists() for n in ("config.yaml", "metrics.jsonl", "checkpoints"))


def summarize_run(run_dir: str | Path, stale_after_s: float | None = 3600.0) -> dict[str, Any]:
    """The row of one run (summarize adds the dense comparison)."""
    run_dir = Path(run_dir)
    problems: list[str] = []
    cfg = _load_config(run_dir / "config.yaml", problems)
    records = _read_metrics(run_dir / "metrics.jsonl", problems)
    row: dict[str, Any] = {"name": run_dir.name, "run_dir": str(run_dir)}
    row.update(_identity(run_dir.name, cfg))
    row.update(_costs(row["cell"], cfg, problems))
    row.update(_progress(records or [], cfg))
    if row.get("train_flops_per_token") is not None:
        row["train_flops_done"] = row["train_flops_per_token"] * row["tokens_seen"]
    row["last_checkpoint"] = _last_checkpoint(run_dir, cfg)
    row["status"] = _status(row, problems, run_dir, records is not None, stale_after_s)
    row["problem"] = "; ".join(problems) or None
    if row.get("max_steps") == STANDARD_STEPS:
        row["paper_val_loss"] = paper_val_loss().get(row["cell"])
    return {k: row.get(k) for k in COLUMNS}


def _load_config(path: Path, problems: list[str]):
    if not path.is_file():
        problems.append(f"{path}: missing")
        return None
    try:
        return load_config(path)
    except Exception as e:  # ConfigError, YAML errors: the row reports them
        problems.append(f"{path}: {type(e).__name__}: {' '.join(str(e).split())}")
        return None


MAX_RECORD_BYTES = 1 << 20
"""A metrics.jsonl line longer than this (1 MiB; the trainer's records are < 1 KiB) is skipped
unparsed: a hostile file with one endless line must not be read into memory whole."""
_NUMBER_FIELDS = ("loss", "val_loss")
MAX_COUNT = 10 ** 18  # steps and tokens beyond this are not a run's (and overflow a float's product)


def _read_metrics(path: Path, problems: list[str]) -> list[dict[str, Any]] | None:
    """The records of metrics.jsonl (None when the file is missing); a line that is not a record
    (corrupt JSON, too long or deeply nested, a field of the wrong type) is skipped and reported as
    path:line, so one damaged or hostile file marks its own run failed and never stops the grid."""
    if not path.is_file():
        return None
    records = []
    with open(path, "rb") as f:
        lineno = 0
        while line := f.readline(MAX_RECORD_BYTES + 1):
            lineno += 1
            if len(line) > MAX_RECORD_BYTES and not line.endswith(b"\n"):
                while (rest := f.readline(MAX_RECORD_BYTES)) and not rest.endswith(b"\n"):
                    pass  # drain the rest of the over-long line in bounded pieces
                problems.append(f"{path}:{lineno}: record longer than {MAX_RECORD_BYTES} bytes, skipped")
                continue
            if not line.strip():
                continue
            record, problem = _parse_record(line.decode("utf-8", errors="replace"))
            if problem:
                problems.append(f"{path}:{lineno}: {problem}")
            else:
                records.append(record)
    return records


def _parse_record(line: str) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None) or (None, what is wrong with the line)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"corrupt record ({e.msg})"
    except (RecursionError, ValueError):  # nesting beyond the parser's stack; an integer of > 4300 digits
        return None, "corrupt record (nested too deeply or a number too long)"
    if not isinstance(record, dict) or not _is_int(record.get("step")):
        return None, "record without an integer step"
    wrong = [k for k in _NUMBER_FIELDS if k in record and not _is_number(record[k])]
    wrong += [k for k in ("step", "tokens") if record.get(k) is not None and not (_is_int(record[k]) and
                                                                                 0 <= record[k] <= MAX_COUNT)]
    curve = record.get("early_exit")
    if curve is not None and not (isinstance(curve, list) and all(v is None or _is_number(v) for v in curve)):
        wrong.append("early_exit")
    if wrong:
        return None, f"record with {', '.join(wrong)} of the wrong type or out of range"
    return record, None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _identity(name: str, cfg) -> dict[str, Any]:
    """Scale, setting, method and paper cell from the run name (grid names such as
    recurrentgpt-medium-isoflops-20k), falling back on the config."""
    tokens = name.lower().split("-")
    family = cfg.model.family if cfg is not None else None
    scale = next((t for t in tokens if t in SCALES), None)
    if scale is None and cfg is not None:
        scale = _SCALE_BY_WIDTH.get(cfg.model.d_model)
    setting = next((SETTINGS[t] for t in tokens if t in SETTINGS), None)
    dense = not spec_for(family).recurrent if family in families() else tokens[0] == "gpt2"
    if setting is None and dense:
        setting = "dense"
    budget = next((t for t in tokens if re.fullmatch(r"\d+k", t)), None)
    cell = "-".join(t for t in name.split("-") if not re.fullmatch(r"\d+k", t.lower()))
    method = (spec_for(family).title if family in families() else family) if family else None
    return {"cell": cell, "scale": scale, "setting": setting, "family": family, "budget": budget, "method": method}


def _costs(cell: str, cfg, problems: list[str]) -> dict[str, Any]:
    """Parameters and FLOPs of the run's own config (rgpt_dist.flops.report under the cell name, so
    the paper columns attach where the cell is one of Table 1's)."""
    if cfg is None:
        return {}
    t = cfg.train
    budget = f"{t.max_steps // 1000}k" if t.max_steps % 1000 == 0 else str(t.max_steps)
    out = {"max_steps": t.max_steps, "budget": budget, "seq_len": t.seq_len,
           "tokens_per_step": t.tokens_per_step()}
    try:
        rep = report(cell, cfg.model, t.seq_len, None)
    except Exception as e:  # a family flops does not know yet: report, do not crash
        problems.append(f"flops: {type(e).__name__}: {e}")
        return out
    keys = ("layout", "unique_blocks", "params", "params_no_embedding", "fwd_flops_per_token", "head_flops_per_token",
            "expected_r", "train_flops_per_token", "paper_params", "paper_params_note", "paper_flops_fwd", "flags")
    out.update({k: rep.get(k) for k in keys})
    out["train_flops_total"] = rep["train_flops_per_token"] * out["tokens_per_step"] * t.max_steps
    return out


def _progress(records: list[dict[str, Any]], cfg) -> dict[str, Any]:
    """Steps done, tokens seen, the last training loss and the last eval record."""
    steps = max((r["step"] for r in records), default=0)
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_loss" in r]
    last = evals[-1] if evals else {}
    if cfg is not None:
        tokens = steps * cfg.train.tokens_per_step()
    else:
        tokens = next((r["tokens"] for r in reversed(train) if isinstance(r.get("tokens"), int)), None)
    curve = last.get("early_exit")
    return {"steps_done": steps, "tokens_seen": tokens, "train_loss": train[-1]["loss"] if train else None,
            "val_loss": last.get("val_loss"), "val_step": last.get("step"), "early_exit": curve,
            "early_exit_str": _curve_str(curve)}


def _curve_str(curve: list | None) -> str | None:
    return " ".join("nan" if v is None else f"{v:.3f}" for v in curve) if curve else None


def _last_checkpoint(run_dir: Path, cfg) -> int | None:
    directory = Path(cfg.checkpoint.dir) if cfg is not None and cfg.checkpoint.dir else run_dir / "checkpoints"
    if not directory.is_dir():
        return None
    steps = [int(p.name[5:]) for p in directory.glob("step_*") if p.is_dir() and p.name[5:].isdigit()]
    return max(steps, default=None)


def _status(row: dict[str, Any], problems: list[str], run_dir: Path, have_metrics: bool,
            stale_after_s: float | None) -> str:
    """finished, running (written to within stale_after_s) or failed-or-incomplete (reason -> problems)."""
    steps, max_steps = row["steps_done"], row.get("max_steps")
    row["progress"] = f"{steps}/{max_steps if max_steps else '?'}"
    if problems:
        return FAILED
    if max_steps and steps >= max_steps:
        return FINISHED
    paths = (run_dir, run_dir / "config.yaml", run_dir / "metrics.jsonl", run_dir / "checkpoints")
    age = time.time() - max(p.stat().st_mtime for p in paths if p.exists())
    if stale_after_s is None or age <= stale_after_s:
        return RUNNING
    where = "no metrics.jsonl" if not have_metrics else f"stopped at step {row['progress']}"
    problems.append(f"{where}: nothing written for {age / 3600:.1f} h")
    return FAILED


def _add_dense_comparison(rows: list[dict[str, Any]]) -> None:
    """delta_vs_dense (val loss minus the dense run's) and the forward (Eq. 1 at R) and training (at
    E[r]) FLOPs-per-token ratios, against the dense run of the same scale and budget (the first by
    name when there are several); a ratio off 1 by more than 5 % is flagged (compute_flags)."""
    dense: dict[tuple, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: r["name"]):
        if row["setting"] == "dense" and row["scale"] and row["max_steps"]:
            dense.setdefault((row["scale"], _cell_steps(row)), row)
    for row in rows:
        ref = dense.get((row["scale"], _cell_steps(row)))
        if row["setting"] == "dense" or ref is None:
            continue
        row["dense_run"] = ref["name"]
        if row["val_loss"] is not None and ref["val_loss"] is not None:
            row["delta_vs_dense"] = row["val_loss"] - ref["val_loss"]
        for kind in ("fwd", "train"):
            ours, theirs = row[f"{kind}_flops_per_token"], ref[f"{kind}_flops_per_token"]
            if ours and theirs:
                row[f"{kind}_ratio_to_dense"] = ours / theirs
        row["flags"] = [*(row["flags"] or []), *compute_flags(row["fwd_ratio_to_dense"], row["train_ratio_to_dense"])]


def _cell_steps(row: dict[str, Any]) -> int | None:
    """The budget of the row's cell: the one its name says (20k: a FLOP-matched run trains longer in
    its cell), else its own max_steps."""
    named = next((t for t in row["name"].lower().split("-") if re.fullmatch(r"\d+k", t)), None)
    return int(named[:-1]) * 1000 if named else row["max_steps"]


def _order(row: dict[str, Any]) -> tuple:
    scale = SCALES.index(row["scale"]) if row["scale"] in SCALES else len(SCALES)
    setting = ["dense", "isoFLOPs", "isoParams"].index(row["setting"]) if row["setting"] else 3
    family = families().get(row["family"])
    return scale, _cell_steps(row) or float("inf"), setting, family.table1_row if family else 99, row["name"]


def write_table(rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """grid.md, grid.csv and grid.json in out_dir (created); returns their paths. (The ablation runs'
    own tables, ablations.md: rgpt_dist.studies.ablation.table, written by `rgpt eval grid`.)"""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, csv_path, js = out_dir / "grid.md", out_dir / "grid.csv", out_dir / "grid.json"
    md.write_text(markdown(rows))
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            flat = {**row, "early_exit": row.get("early_exit_str"), "flags": "; ".join(row.get("flags") or [])}
            writer.writerow({k: "" if v is None else v for k, v in flat.items()})
    js.write_text(strict_json.dumps(rows, indent=2) + "\n")
    return [md, csv_path, js]


_HEADER = ["Model", "Config", "Layers", "Budget", "FLOPs/token fwd", "FLOPs/token train", "Params (non-emb.)",
           "Train FLOPs", "Val loss",
           "Δ vs dense", "Paper FLOPs/fwd, Params, Val loss", "Early exit r*=0..R", "Status"]
_SECTIONS = [("isoFLOPs", "isoFLOPs regime (matched FLOPs per forward pass)"),
             ("isoParams", "isoParams regime (matched unique parameters)")]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The Table 1 layout: per regime, each (scale, budget) group's dense runs then its recurrent runs;
    runs of unknown scale or setting in a last table, then every run's problem."""
    counts = {s: sum(r["status"] == s for r in rows) for s in (FINISHED, RUNNING, FAILED)}
    out = ["# Grid summary (paper Table 1 layout)", "",
           f"{len(rows)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ".",
           "FLOPs/token fwd: Eq. 1 forward per token at R, head excluded, S = the run's seq_len; train: per token "
           "at E[r], head and what training adds included (Ouro's every readout); (Nx): the ratio to the dense run of "
           "the cell, ! beyond 5 %: not a comparison at equal compute. Params: unique, tied embedding counted once. "
           "Train FLOPs: over the whole budget. Δ: val loss minus the dense run of the same scale and budget. Paper: "
           "Table 1 (val loss at the 20k budget only).", ""]
    ablation = [r for r in rows if r["name"].startswith("ablation-")]  # their own tables: ablations.md
    if ablation:
        out += [f"{len(ablation)} ablation runs: see ablations.md.", ""]
    placed = {r["name"] for r in ablation}
    every, rows = rows, [r for r in rows if r["name"] not in placed]
    groups = sorted({(r["scale"], _cell_steps(r)) for r in rows if r["scale"] in SCALES and r["max_steps"]},
                    key=lambda g: (SCALES.index(g[0]), g[1]))
    for setting, title in _SECTIONS:
        body = []
        for scale, steps in groups:
            cell = [r for r in rows if (r["scale"], _cell_steps(r)) == (scale, steps)]
            rec = [r for r in cell if r["setting"] == setting]
            dense = [r for r in cell if r["setting"] == "dense" and (rec or setting == "isoFLOPs")]
            body += [_md_row(r) for r in dense + rec]
            placed.update(r["name"] for r in dense + rec)
        if body:
            out += [f"## {title}", "", *_md_table(body), ""]
    rest = [r for r in rows if r["name"] not in placed]
    if rest:
        out += ["## Other runs", "", *_md_table([_md_row(r) for r in rest]), ""]
    unequal = [f"- {mdtext.code(r['name'])}: {'; '.join(flags)} ({mdtext.code(r['dense_run'])})"
               for r in every for flags in [compute_flags(r["fwd_ratio_to_dense"], r["train_ratio_to_dense"])] if flags]
    if unequal:
        out += ["## Not at equal compute (FLOPs per token off the cell's dense run by more than 5 %)", "", *unequal, ""]
    problems = [f"- {mdtext.code(r['name'])} ({r['status']}): {mdtext.cell(r['problem'])}"
                for r in every if r["problem"]]
    if problems:
        out += ["## Problems", "", *problems, ""]
    return "\n".join(out)


def _md_table(body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(c) + " |" for c in [_HEADER, ["---"] * len(_HEADER), *body]]  # cells escaped by _md_row


def _md_row(r: dict[str, Any]) -> list[str]:
    model = f"{r['method']} {r['scale'] or ''}".strip() + (" baseline" if r["setting"] == "dense" else "")
    model = f"{mdtext.cell(model)} ({mdtext.code(r['name'])})" if r["method"] else mdtext.code(r["name"])
    params = "-" if r["params"] is None else f"{_si(r['params'])} ({_si(r['params_no_embedding'])})"
    paper = "-"
    if r["paper_params"] is not None or r["paper_val_loss"] is not None:
        note = r.get("paper_params_note") or ""
        paper = f"{_si(r['paper_flops_fwd'])}, {_si(r['paper_params'])}{note}, {_fmt(r['paper_val_loss'], '.2f')}"
    blocks = "-" if r["unique_blocks"] is None else str(r["unique_blocks"])
    return [model, mdtext.cell(r["layout"]), blocks, mdtext.cell(r["budget"]),
            _per_token(r, "fwd"), _per_token(r, "train"), params, _si(r["train_flops_total"]), _fmt(r["val_loss"], ".4f"),
            _fmt(r["delta_vs_dense"], "+.4f"), mdtext.cell(paper), mdtext.cell(r["early_exit_str"]),
            mdtext.cell(f"{r['status']} {r['progress']}")]


def _per_token(r: dict[str, Any], kind: str) -> str:
    """FLOPs per token and, beside a dense run, its ratio to it; '!' marks a ratio off 1 by > 5 %."""
    value, ratio = r[f"{kind}_flops_per_token"], r[f"{kind}_ratio_to_dense"]
    if ratio is None:
        return _si(value)
    return f"{_si(value)} ({ratio:.2f}x{' !' if compute_flags(ratio, None) else ''})"


def _si(x: float | None) -> str:
    """1.84G, 124M, 5.9E (FLOPs and parameter counts, 3 significant digits)."""
    if x is None:
        return "-"
    for scale, unit in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)
