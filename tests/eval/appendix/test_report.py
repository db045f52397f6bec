"""rgpt_dist.eval.appendix: the registry's contract, run_all (skips an analysis whose inputs are
missing, refuses unknown names before any work) and the report (markdown links, HTML with every plot
embedded), and Result.save's strict JSON."""
import base64
import json

import pytest
import torch

from rgpt_dist.eval.appendix import ANALYSES, analysis
from rgpt_dist.eval.appendix.common import Context, Result, figure, save_figure
from rgpt_dist.eval.appendix.report import run_all, write_report


@pytest.mark.parametrize("name", list(ANALYSES))
def test_every_analysis_follows_the_contract(name):
    module = analysis(name)
    assert module.NAME == name and module.TITLE and callable(module.run)
    assert set(module.NEEDS) <= {"dense", "prompt"}


def test_unknown_analysis_is_refused_before_any_work(model, batches, tmp_path):
    ctx = Context(model=model, batches=batches, out=tmp_path / "out")
    with pytest.raises(ValueError, match="unknown analysis 'nope'"):
        run_all(ctx, ["projection", "nope"])
    assert not ctx.out.exists()


def test_missing_inputs_skip_the_analysis_with_a_reason(model, batches, tmp_path):
    ctx = Context(model=model, batches=batches, out=tmp_path)
    results, skipped = run_all(ctx, ["dense_cka", "projection"])
    assert [r.name for r in results] == ["projection"]
    assert skipped == [f"{analysis('dense_cka').TITLE}: skipped, needs dense"]
    assert (tmp_path / "projection.json").exists() and not (tmp_path / "dense_cka.json").exists()


def tiny_png(path):
    fig = figure((1, 1))
    fig.subplots().plot([0, 1], [1, 0])
    return save_figure(fig, path)


def test_report_links_and_embeds_every_plot(tmp_path):
    results = [Result("a", "A: first", {"x": 1}, [{"i": 0}], ["| k | v |", "|---|---|", "| <b> | 1 |"],
                      [tiny_png(tmp_path / "a.png")]),
               Result("b", "B: second", {}, [], ["| x |", "|---|", "| 1 |", "Plain text & more."],
                      [tiny_png(tmp_path / "b.png")])]
    md, html = write_report(results, tmp_path, "Header line.", ["C: skipped, needs dense"])
    text, page = md.read_text(), html.read_text()
    assert "| 1 |\n\nPlain text & more." in text  # a table ends before the text after it
    for heading in ("## A: first", "## B: second", "Header line.", "- C: skipped, needs dense", "](a.png)", "](b.png)"):
        assert heading in text
    for png in ("a.png", "b.png"):
        assert base64.b64encode((tmp_path / png).read_bytes()).decode() in page
    assert "<td>&lt;b&gt;</td>" in page and "Plain text &amp; more." in page and "<h2>A: first</h2>" in page
    assert "|---|" not in page  # the separator row is not rendered as a table row


def test_result_json_is_strict(tmp_path):
    """NaN and inf become null (strict JSON has neither); tensors become lists."""
    res = Result("n", "N", {"v": [1.0, float("nan"), float("inf")], "t": torch.tensor([0.5, float("nan")])},
                 [{"a": None, "b": 2}], ["s"])
    js, csv = res.save(tmp_path)
    record = json.loads(js.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert record["v"] == [1.0, None, None] and record["t"] == [0.5, None] and record["summary"] == ["s"]
    assert csv.read_text().splitlines() == ["a,b", ",2"]


# ---- non-finite models: the report says so instead of failing in LAPACK ------------------------
def _copy_with(model, edit):
    import copy
    m = copy.deepcopy(model)
    with torch.no_grad():
        edit(m)
    return m.eval()


def test_nonfinite_weights_or_states_skip_every_analysis_naming_why(model, dense, batches, tmp_path):
    nan = _copy_with(model, lambda m: m.recurrence.gate_out.weight.view(-1)[3].fill_(float("nan")))
    results, skipped = run_all(Context(model=nan, batches=batches, out=tmp_path / "w"))
    assert results == [] and skipped == ["every analysis skipped: the weights are not finite: 1 of "
                                         f"{len(list(nan.parameters())) + len(list(nan.buffers()))} tensors "
                                         "hold NaN or inf (recurrence.gate_out.weight)"]
    huge = _copy_with(model, lambda m: m.recurrence.proj_h.weight.fill_(3e38))  # finite, but h^(1) overflows
    results, skipped = run_all(Context(model=huge, batches=batches, out=tmp_path / "s"))
    assert results == [] and skipped == ["every analysis skipped: the activations are not finite: the state h^(1) "
                                         "of the first batch holds NaN or inf (the weights are finite)"]
    bad_dense = _copy_with(dense, lambda m: next(m.parameters()).view(-1)[0].fill_(float("inf")))
    results, skipped = run_all(Context(model=model, batches=batches, out=tmp_path / "d", dense=bad_dense),
                               ["dense_cka", "projection"])
    assert [r.name for r in results] == ["projection"]
    assert skipped[0].startswith(f"{analysis('dense_cka').TITLE}: skipped, the dense model's weights are not finite")


def test_report_tables_escape_pipes_and_line_breaks_of_decoded_tokens(model, batches, tmp_path):
    from rgpt_dist.eval.appendix import top_tokens
    ctx = Context(model=model, batches=batches, out=tmp_path, decode=lambda ids: f"a|b\r\n|{ids[0]}|")
    res = top_tokens.run(ctx)
    table = [line for line in res.summary if line.startswith("|")]
    assert len(table) == ctx.depth + 3 and all(line.count("|") == 6 for line in table)
    assert "| a&#124;b\\r\\n&#124;" in table[2]  # step 0's top-1 token, its pipes and line breaks escaped
    write_report([res], tmp_path, "header")
    page = (tmp_path / "report.html").read_text()
    assert "<td>a|b" in page and "&amp;#124;" not in page
