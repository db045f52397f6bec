"""`rgpt-eval curve` and `rgpt-eval diagnostics` on a training checkpoint (launcher/eval.py: "SOURCE is
an rgpt-export directory or a training checkpoint (run dir, checkpoints/ or step_*); the validation
data defaults to the run's own"), on the shared short runs of tests/export/conftest.py (no launch of
their own). The tp = 2 x ZeRO-3 case, against the loss the trainer logged, is in
tests/train/test_distributed.py."""
import json

import pytest
import torch

from launcher.eval import main as rgpt_eval
from rgpt_dist.eval.early_exit import val_batches

pytestmark = pytest.mark.slow

BATCHES = ["--batches", "2", "--batch-size", "4"]


def curve(source, out):
    assert rgpt_eval(["curve", str(source), "--out", str(out), *BATCHES]) == 0
    return json.loads((out / "early_exit.json").read_text())


@pytest.mark.parametrize("name", ["zero2-trained", "poisson-tp2", "rrt-zero3"])
def test_curve_on_a_run_is_the_curve_of_its_export(runs, name, tmp_path):
    """The run directory, its checkpoints/ directory and its newest step_* directory evaluate alike, on
    the run's own validation data (no --data), and as the export of the same checkpoint; the loss
    at R is the consolidated model's own on those batches (ZeRO-2, tp = 2 and ZeRO-3 checkpoints of
    every looped family)."""
    from rgpt_dist.config import load_config
    from rgpt_dist.checkpoints.consolidate import consolidate
    from rgpt_dist.export.exporter import export
    from rgpt_dist.registry import build_model

    run = runs[name]
    tag = max((run / "checkpoints").glob("step_*"))
    rows = curve(run, tmp_path / "run")
    assert curve(run / "checkpoints", tmp_path / "ckpts") == rows
    assert curve(tag, tmp_path / "tag") == rows
    exported = curve(export(run, tmp_path / "exp"), tmp_path / "exp-curve")
    assert [r["depth"] for r in exported] == [r["depth"] for r in rows]
    assert [r["loss"] for r in exported] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
    assert len({round(r["loss"], 5) for r in rows}) > 1  # the depths differ: the comparison is not vacuous

    cfg = load_config(run / "config.yaml")
    model = build_model(cfg.model)
    model.load_state_dict(consolidate(run).state_dict)
    model.eval()
    R = cfg.model.n_loops
    batches = val_batches(cfg.data.paths, cfg.data.val_split, 4, 2)
    with torch.no_grad():
        expected = sum(model(x, y, r=R).loss.item() for x, y in batches) / len(batches)
    assert next(r["loss"] for r in rows if r["depth"] == R) == pytest.approx(expected, rel=1e-5)


def test_diagnostics_on_a_run_equal_those_of_its_export(runs, tmp_path):
    """`rgpt-eval diagnostics RUN` writes the per-step statistics, the plots and the gate heatmap, the
    same numbers as on the export; a dense run is refused with exit status 2 and the reason."""
    from rgpt_dist.export.exporter import export

    run = runs["zero2-trained"]
    outs = {}
    for label, source in (("run", run), ("exp", export(run, tmp_path / "exp"))):
        outs[label] = tmp_path / f"diag-{label}"
        assert rgpt_eval(["diagnostics", str(source), "--out", str(outs[label]), *BATCHES]) == 0
    written = {p.name for p in outs["run"].iterdir()}
    assert {"diagnostics.json", "diagnostics.csv", "cka.png", "gate_heatmap.png"} <= written
    got, expected = (json.loads((outs[k] / "diagnostics.json").read_text()) for k in ("run", "exp"))
    assert got.keys() == expected.keys() and got
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_dense_run_curve_has_one_point_and_no_diagnostics(runs, tmp_path, capsys):
    rows = curve(runs["dense"], tmp_path / "c")
    assert [r["depth"] for r in rows] == [None] and rows[0]["loss"] > 0
    assert rgpt_eval(["diagnostics", str(runs["dense"]), "--out", str(tmp_path / "d"), *BATCHES]) == 2
    assert "gpt2 model" in capsys.readouterr().err


def test_diagnostics_all_writes_every_analysis_and_one_report(runs, tmp_path, capsys):
    """`rgpt-eval diagnostics RUN --all --dense DENSE --prompt TEXT` writes every Appendix E analysis
    (JSON, CSV, plot) and report.md / report.html with each analysis's section and every plot embedded;
    misuse is refused with exit status 2 before anything is written."""
    import base64

    from rgpt_dist.data.tokenizer import get_encoding
    from rgpt_dist.eval.appendix import ANALYSES, analysis

    def diagnostics(out, *extra):
        return rgpt_eval(["diagnostics", str(runs["zero2-trained"]), "--out", str(out), *BATCHES, *extra])

    out, prompt = tmp_path / "all", "def main():\n    return"
    assert diagnostics(out, "--all", "--dense", str(runs["dense"]), "--prompt", prompt) == 0
    for name in ANALYSES:
        assert {f"{name}.json", f"{name}.csv"} <= {p.name for p in out.iterdir()}, name
        record = json.loads((out / f"{name}.json").read_text())
        assert record["title"] == analysis(name).TITLE and record["summary"]
    report, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) >= len(ANALYSES)
    for png in pngs:
        assert f"]({png.name})" in report
        assert base64.b64encode(png.read_bytes()).decode() in page  # embedded, not linked
    assert all(analysis(n).TITLE in report for n in ANALYSES)
    assert json.loads((out / "top_tokens.json").read_text())["prompt"] == get_encoding().encode_ordinary(prompt)

    bad = tmp_path / "bad"
    for extra, reason in ((["--dense", str(runs["dense"])], "go with --all"),
                          (["--all", "--only", "diagnostics,nonsense"], "unknown analysis 'nonsense'"),
                          (["--all", "--dense", str(runs["zero2-trained"])], "not a dense GPT-2")):
        capsys.readouterr()
        assert diagnostics(bad, *extra) == 2
        assert reason in capsys.readouterr().err
    assert not bad.exists() or not any(bad.iterdir())
