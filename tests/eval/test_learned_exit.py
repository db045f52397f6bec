"""Per-token exits at a threshold (Ouro, #14): rgpt-eval's rows against the model's own exits, the
FLOPs they spend against the spec's count per depth, and `rgpt-eval curve --exit-thresholds` end
to end on a native export."""
import json

import pytest
import torch

from rgpt_dist.config import GPT2Config
from rgpt_dist.eval.learned_exit import threshold_exit_rows
from rgpt_dist.models.ouro.config import OuroConfig
from rgpt_dist.models.spec import spec_for
from rgpt_dist.registry import build_model
from tests.eval.test_early_exit import SMALL, perturbed, random_batches


def ouro(**extra):
    model = perturbed(build_model(OuroConfig(n_pre=1, n_rec=1, n_coda=1, n_loops=3, **SMALL, **extra), seed=0))
    with torch.no_grad():
        model.exits.gate.proj.weight.mul_(30)  # gates spread over (0, 1): tokens leave at different depths
    return model


def test_rows_are_the_token_weighted_exits_and_their_flops():
    model, batches = ouro(), random_batches()
    spec, cfg = spec_for(model.cfg), model.cfg
    rows = threshold_exit_rows(model, batches, [0.2, 0.6, 1.0])
    for row in rows:
        depths = torch.cat([model.exit_at_threshold(x, y, row["threshold"])[0].flatten() for x, y in batches])
        losses = torch.cat([model.exit_at_threshold(x, y, row["threshold"])[1].flatten() for x, y in batches])
        assert row["loss"] == pytest.approx(losses.double().mean().item(), rel=1e-9)
        assert row["mean_depth"] == pytest.approx(depths.double().mean().item(), rel=1e-12)
        want = sum(spec.exit_flops(cfg, 16, int(t)) for t in depths) / len(depths)
        assert row["flops_per_token"] == pytest.approx(want, rel=1e-12)
        assert sum(row["depth_fraction"]) == pytest.approx(1.0)
    # a higher threshold keeps tokens longer (not vacuous: the depths differ), never beyond R's compute
    assert rows[0]["mean_depth"] < rows[1]["mean_depth"] < rows[2]["mean_depth"] <= 3
    assert 0 < rows[0]["flops_vs_depth_R"] < rows[2]["flops_vs_depth_R"] <= 1
    with pytest.raises(ValueError, match="has no learned exit"):
        threshold_exit_rows(perturbed(build_model(GPT2Config(n_layer=2, **SMALL), seed=0)), batches, [0.5])


def test_cli_curve_writes_the_threshold_exits(dataset, tmp_path, capsys):
    from launcher.eval import main
    from rgpt_dist.checkpoints.native import write_native

    cfg = OuroConfig(n_pre=1, n_rec=1, n_coda=1, n_loops=2, vocab_size=50257, block_size=64, d_model=32, n_head=4)
    meta = {"step": 3, "data": {"paths": [str(dataset)], "val_split": "val", "seq_len": 32}}
    write_native(perturbed(build_model(cfg, seed=0)).state_dict(), cfg, tmp_path / "exp" / "native", torch.float32, meta)
    out = tmp_path / "c"
    assert main(["curve", str(tmp_path / "exp"), "--out", str(out), "--batches", "1", "--batch-size", "2",
                 "--exit-thresholds", "0.5,0.9"]) == 0
    rows = json.loads((out / "exit_threshold.json").read_text())
    assert [r["threshold"] for r in rows] == [0.5, 0.9] and (out / "exit_threshold.csv").is_file()
    assert "exit q=0.9" in capsys.readouterr().out
    assert main(["curve", str(tmp_path / "exp"), "--out", str(out), "--exit-thresholds", "1.5"]) == 2
    assert "0 < q <= 1" in capsys.readouterr().err
