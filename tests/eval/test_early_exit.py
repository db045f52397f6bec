"""The early-exit curve against separate forwards at each depth, and rgpt-eval's curve/diagnostics
commands end to end on an export of a random model."""
import json

import pytest
import torch

from rgpt_dist.config import GPT2Config, RecurrentGPTConfig
from rgpt_dist.data.index import DatasetError
from rgpt_dist.eval.early_exit import early_exit_curve, val_batches
from rgpt_dist.flops import forward_flops, head_flops
from rgpt_dist.registry import build_model

SMALL = dict(vocab_size=300, block_size=32, d_model=32, n_head=4)


def random_batches(n=3, B=2, T=16):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        idx = torch.randint(0, 300, (B, T + 1), generator=g)
        out.append((idx[:, :-1], idx[:, 1:]))
    return out


def perturbed(model):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def test_curve_equals_separate_forwards_at_each_depth():
    """One all_exits pass at the deepest R* gives, at every depth, the token-weighted loss of a
    separate forward at that depth (depths below, at and beyond R, and 0 = prelude only)."""
    model = perturbed(build_model(RecurrentGPTConfig(n_pre=1, n_rec=1, n_coda=1, n_loops=3, **SMALL), seed=0))
    batches = random_batches()
    rows = early_exit_curve(model, batches, [6, 0, 1, 3])
    assert [r["depth"] for r in rows] == [0, 1, 3, 6]
    with torch.no_grad():
        for row in rows:
            expected = sum(model(x, y, r=row["depth"]).loss.item() for x, y in batches) / len(batches)
            assert row["loss"] == pytest.approx(expected, abs=1e-5)
            assert row["flops_per_token"] == forward_flops(model.cfg, 16, row["depth"]) + head_flops(model.cfg)
    assert len({round(r["loss"], 6) for r in rows}) == 4  # the depths differ: the check is not vacuous


def test_dense_model_has_one_point():
    model = perturbed(build_model(GPT2Config(n_layer=2, **SMALL), seed=0))
    batches = random_batches()
    (row,) = early_exit_curve(model, batches, [1, 2])
    with torch.no_grad():
        assert row["depth"] is None
        assert row["loss"] == pytest.approx(sum(model(x, y).loss.item() for x, y in batches) / 3, abs=1e-5)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, dataset):
    """A native export of a random RecurrentGPT (GPT-2 vocabulary) whose record names the session's data."""
    from rgpt_dist.checkpoints.native import write_native

    root = tmp_path_factory.mktemp("eval")
    data = dataset
    cfg = RecurrentGPTConfig(n_pre=1, n_rec=1, n_coda=1, n_loops=2, vocab_size=50257, block_size=64, d_model=32, n_head=4)
    model = perturbed(build_model(cfg, seed=0))
    meta = {"step": 7, "data": {"paths": [str(data)], "val_split": "val", "seq_len": 32}}
    write_native(model.state_dict(), cfg, root / "exp" / "native", torch.float32, meta)
    return root / "exp", data


def test_val_batches_read_the_split_in_order(export_dir):
    _, data = export_dir
    batches = val_batches([str(data)], "val", 4, 3)
    assert len(batches) == 3 and batches[0][0].shape == (4, 32)
    assert all(torch.equal(x[:, 1:], y[:, :-1]) for x, y in batches)
    again = val_batches([str(data)], "val", 4, 3)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))
    with pytest.raises(DatasetError, match="no index.json"):
        val_batches([str(data)], "nosuchsplit", 4, 1)


def test_cli_curve_and_diagnostics(export_dir, tmp_path, capsys):
    from launcher.eval import main

    exp, _ = export_dir
    assert main(["curve", str(exp), "--out", str(tmp_path / "c"), "--batches", "2", "--batch-size", "4"]) == 0
    rows = json.loads((tmp_path / "c" / "early_exit.json").read_text())
    assert [r["depth"] for r in rows] == [0, 1, 2, 3, 4]  # default 0..2R
    assert (tmp_path / "c" / "early_exit.png").stat().st_size > 0
    assert main(["diagnostics", str(exp), "--out", str(tmp_path / "d"), "--batches", "1", "--batch-size", "2"]) == 0
    assert {"diagnostics.json", "diagnostics.csv", "cka.png", "gate_heatmap.png"} <= {p.name for p in (tmp_path / "d").iterdir()}
    assert main(["curve", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err


# ---- an export whose weights are not finite: reports that say so, strict JSON, no LinAlgError ----
def _strict_json(path):
    def refuse(token):
        raise ValueError(f"{path}: non-strict JSON token {token}")
    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.fixture(scope="module", params=["nan", "inf"])
def nonfinite_export(request, tmp_path_factory, dataset):
    """The export_dir model with one NaN (in the recurrence's projection) or one inf (in the embedding)."""
    from rgpt_dist.checkpoints.native import write_native

    cfg = RecurrentGPTConfig(n_pre=1, n_rec=1, n_coda=1, n_loops=2, vocab_size=50257, block_size=64, d_model=32,
                             n_head=4)
    sd = perturbed(build_model(cfg, seed=0)).state_dict()
    name = "recurrence.proj_h.weight" if request.param == "nan" else "embed.wte.weight"
    sd[name][0, 0] = float(request.param)
    root = tmp_path_factory.mktemp(f"nonfinite-{request.param}")
    meta = {"step": 7, "data": {"paths": [str(dataset)], "val_split": "val", "seq_len": 32}}
    write_native(sd, cfg, root / "exp" / "native", torch.float32, meta)
    return root / "exp", name


def test_nonfinite_weights_give_reports_that_name_them(nonfinite_export, tmp_path, capsys):
    from launcher.eval import main

    exp, bad = nonfinite_export
    small = ["--batches", "1", "--batch-size", "2"]
    assert main(["curve", str(exp), "--out", str(tmp_path / "c"), *small]) == 0
    rows = _strict_json(tmp_path / "c" / "early_exit.json")  # NaN losses are written as null
    assert [r["problem"] for r in rows] == [f"the weights are not finite: 1 of 51 tensors hold NaN or inf ({bad})"] * 5
    assert bad == "embed.wte.weight" or all(r["loss"] is None for r in rows[1:])  # NaN from step 1 on
    assert f"(the weights are not finite: 1 of 51 tensors hold NaN or inf ({bad}))" in capsys.readouterr().out
    assert main(["diagnostics", str(exp), "--out", str(tmp_path / "d"), *small]) == 0
    assert bad in _strict_json(tmp_path / "d" / "diagnostics.json")["problem"]
    assert main(["diagnostics", str(exp), "--all", "--out", str(tmp_path / "a"), *small]) == 0
    out = capsys.readouterr()
    assert f"every analysis skipped: the weights are not finite: 1 of 51 tensors hold NaN or inf ({bad})" in out.out
    report = (tmp_path / "a" / "report.md").read_text()
    assert f"every analysis skipped: the weights are not finite" in report and bad in report
    assert "Traceback" not in out.err and "LinAlgError" not in out.err


def test_depths_beyond_16x_the_trained_depth_or_negative_are_refused(export_dir, tmp_path, capsys):
    from launcher.eval import main

    model = perturbed(build_model(RecurrentGPTConfig(n_pre=1, n_rec=1, n_coda=1, n_loops=3, **SMALL), seed=0))
    batches = random_batches(n=1)
    with pytest.raises(ValueError, match=r"depths \[-1\] are outside 0\.\.48 \(16 x the trained depth R = 3"):
        early_exit_curve(model, batches, [-1, 2])  # -1 would silently read the deepest exit
    with pytest.raises(ValueError, match=r"depths \[1000000000\] are outside 0\.\.48"):
        early_exit_curve(model, batches, [0, 10 ** 9])
    assert [r["depth"] for r in early_exit_curve(model, batches, [48])] == [48]  # the bound itself runs
    exp, _ = export_dir
    assert main(["curve", str(exp), "--depths", "0,1000000000", "--out", str(tmp_path / "c")]) == 2
    assert "depths [1000000000] are outside 0..32 (16 x the trained depth R = 2" in capsys.readouterr().err
