import json

from launcher.flops import main
from rgpt_dist.config import FLAVOURS


def test_table_lists_every_flavour_and_flags_the_paper_disagreements(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in FLAVOURS:
        assert name in out
    assert "! recurrentgpt-small-isoflops: params 63.6M vs paper 36M" in out
    assert "! recurrentgpt-small-isoflops: fwd FLOPs ratio to dense 1.284 vs paper 1.000" in out
    assert "recurrentgpt-large-isoparams: params" not in out  # within 2%: not flagged


def test_json_rows_for_named_flavours_and_yaml(capsys):
    assert main(["recurrentgpt-medium-isoflops", "configs/models/gpt2-debug.yaml", "--json", "--seq-len", "512"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["recurrentgpt-medium-isoflops", "configs/models/gpt2-debug.yaml"]
    rec = rows[0]
    assert rec["expected_r"] == 2.5 and rec["seq_len"] == 512 and rec["unique_blocks"] == 9
    assert rec["block_executions"] == 24 and rec["train_ratio_to_dense"] < rec["fwd_ratio_to_dense"]


def test_overrides_and_solver(capsys):
    assert main(["recurrentgpt-debug", "--set", "model.n_loops=8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["layout"] == "1+1x8+1"
    assert main(["--solve", "n_loops", "--dense", "gpt2-medium", "--n-pre", "2", "--n-coda", "2", "--n-rec", "5",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["block_matched"] == 4 and {c["value"] for c in out["candidates"]} >= {3, 4}


def test_errors_exit_2_with_a_message(capsys):
    assert main(["recurrentgpt-tiny"]) == 2
    assert "neither a YAML file nor a flavour" in capsys.readouterr().err
    assert main(["recurrentgpt-debug", "--set", "model.tau=0"]) == 2
    assert "model.tau=0.0 must be > 0" in capsys.readouterr().err
    assert main(["--solve", "n_loops", "--dense", "recurrentgpt-debug", "--n-rec", "1"]) == 2
