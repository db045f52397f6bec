"""Runs the Appendix E analyses and writes one page: report.md (plots linked beside it) and
report.html (the same page, plots embedded as data URIs, one self-contained file).

    results = run_all(ctx)                # every analysis whose inputs ctx has (ANALYSES order)
    write_report(results, ctx.out, header)
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

import torch

from rgpt_dist.eval.appendix import ANALYSES, analysis
from rgpt_dist.eval.appendix.common import Context, Result, check_model, trace
from rgpt_dist.eval.finite import nonfinite_weights
from rgpt_dist.markdown import PIPE


def run_all(ctx: Context, names: list[str] | None = None) -> tuple[list[Result], list[str]]:
    """Runs `names` (default: all of ANALYSES) in order; an analysis whose NEEDS are missing from ctx
    (no dense model, say) is skipped with a reason. A model whose weights or first-batch states are not
    finite has no analysis run: the one skipped reason says which (the report leads with it).
    Returns (results, skipped reasons)."""
    modules = [analysis(name) for name in names or list(ANALYSES)]   # unknown names refused before any work
    ctx.out.mkdir(parents=True, exist_ok=True)
    undefined = _not_finite(ctx)
    if undefined:  # every statistic would be NaN (or LAPACK would fail on it): say so instead
        return [], [f"every analysis skipped: {undefined}"]
    dense = nonfinite_weights(ctx.dense) if ctx.dense is not None else None
    results, skipped = [], []
    for module in modules:
        missing = [n for n in module.NEEDS if getattr(ctx, n) is None]
        if missing:
            skipped.append(f"{module.TITLE}: skipped, needs {', '.join(missing)}")
        elif dense and "dense" in module.NEEDS:
            skipped.append(f"{module.TITLE}: skipped, the dense model's {dense.removeprefix('the ')}")
        else:
            results.append(module.run(ctx))
    return results, skipped


@torch.no_grad()
def _not_finite(ctx: Context) -> str | None:
    """Why the analysed model's numbers are undefined: non-finite weights (named), or states h^(i) of
    the first batch that overflow to NaN / inf with finite weights; None when all is finite."""
    weights = nonfinite_weights(ctx.model)
    if weights:
        return weights
    r = check_model(ctx.model, ctx.r)
    states = trace(ctx.model, ctx.batches[0][0], r).h
    bad = [i for i, h in enumerate(states) if not bool(torch.isfinite(h).all())]
    if bad:
        return (f"the activations are not finite: the state h^({bad[0]}) of the first batch holds NaN or inf "
                f"(the weights are finite)")
    return None


def write_report(results: list[Result], out: Path, header: str, skipped: list[str] = ()) -> list[Path]:
    """report.md and report.html in `out`; figures are referenced relative to `out`."""
    md = ["# Appendix E diagnostics", "", header, ""]
    md += [f"- {s}" for s in skipped] + ([""] if skipped else [])
    for res in results:
        md += [f"## {res.title}", "", *_paragraphs(res.summary), "",
               f"Data: `{res.name}.json`, `{res.name}.csv`.", ""]
        md += [f"![{p.stem}]({p.name})" for p in res.figures] + [""]
    (out / "report.md").write_text("\n".join(md))
    (out / "report.html").write_text(_html(md, out))
    return [out / "report.md", out / "report.html"]


def _paragraphs(lines: list[str]) -> list[str]:
    """The lines with a blank line wherever a table ends and text follows (markdown would otherwise
    read the text as one more table row)."""
    out: list[str] = []
    for line in lines:
        if out and out[-1].startswith("|") and line and not line.startswith("|"):
            out.append("")
        out.append(line)
    return out


def _text(markdown: str) -> str:
    """Markdown text as HTML text: the pipes rgpt_dist.markdown wrote as &#124; back as '|'."""
    return html.escape(markdown.replace(PIPE, "|"))


def _html(md: list[str], out: Path) -> str:
    """A minimal rendering of the report's markdown: headings, tables, images (embedded), text."""
    body, table = [], []

    def flush():
        if table:
            rows = [r for r in table if not set(r.replace("|", "").strip()) <= set("-: ")]
            cells = [[_text(c.strip()) for c in r.strip().strip("|").split("|")] for r in rows]
            head = "".join(f"<th>{c}</th>" for c in cells[0])
            rest = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in cells[1:])
            body.append(f"<table><tr>{head}</tr>{rest}</table>")
            table.clear()

    for line in md:
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{_text(line[level:].strip())}</h{level}>")
        elif line.startswith("![") and line.endswith(")"):
            name = line[line.index("(") + 1: -1]
            data = base64.b64encode((out / name).read_bytes()).decode()
            body.append(f'<p><img alt="{html.escape(name)}" src="data:image/png;base64,{data}"></p>')
        elif line:
            body.append(f"<p>{_text(line)}</p>")
    flush()
    style = "body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}" \
            "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}img{max-width:100%}"
    return f"<!doctype html><html><head><meta charset='utf-8'><title>Appendix E</title><style>{style}</style>" \
           f"</head><body>{''.join(body)}</body></html>"
