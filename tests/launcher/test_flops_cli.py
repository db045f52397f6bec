import json

import pytest

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


def test_budget_adds_training_flops_and_gpu_hours_per_budget(capsys):
    assert main(["recurrentgpt-medium-isoflops", "gpt2-medium", "--budget", "20k,40k", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["budget"], r["steps"]) for r in rows] == [
        ("recurrentgpt-medium-isoflops", "20k", 20000), ("recurrentgpt-medium-isoflops", "40k", 40000),
        ("gpt2-medium", "20k", 20000), ("gpt2-medium", "40k", 40000)]
    rec = rows[0]  # the hand computation of tests/test_flops.py: 1,840,748,544 FLOPs per token
    assert rec["tokens_per_step"] == 491520 and rec["tokens"] == 9_830_400_000
    assert rec["train_flops_total"] == pytest.approx(1_840_748_544 * 9_830_400_000, rel=1e-12)
    assert rec["gpu_hours"] == pytest.approx(rec["train_flops_total"] / (989e12 * 0.4) / 3600, rel=1e-12)
    assert rec["node_hours"] == pytest.approx(rec["gpu_hours"] / 8) and rec["gpus_per_node"] == 8
    assert rows[1]["gpu_hours"] == pytest.approx(2 * rec["gpu_hours"])
    assert rec["expected_r"] == 2.5 and rec["layout"] == "2+5x4+2"  # the report columns are still there


def test_budget_table_and_its_options(capsys):
    assert main(["recurrentgpt-medium-isoflops", "--budget", "20k", "--gpu-peak", "989e12", "--mfu", "0.4"]) == 0
    out = capsys.readouterr().out
    header, row, note = out.splitlines()
    assert header.split() == ["name", "layout", "params", "expected_r", "train_flops_per_token", "budget", "steps",
                              "tokens", "train_flops_total", "gpu_hours", "node_hours"]
    assert row.split() == ["recurrentgpt-medium-isoflops", "2+5x4+2", "171,128,832", "2.5", "1.841e+09", "20k",
                           "20,000", "9.83e+09", "1.810e+19", "12.7", "1.6"]
    assert note.startswith("assumed: peak 989 TFLOP/s per GPU, MFU 40% (an assumption, not a measurement)")
    assert main(["recurrentgpt-medium-isoflops", "--budget", "5k,1000", "--mfu", "0.5", "--gpu-peak", "1e15",
                 "--gpus-per-node", "4", "--tokens-per-step", "1000", "--json"]) == 0
    five, one = json.loads(capsys.readouterr().out)
    assert (five["steps"], one["steps"], five["tokens"]) == (5000, 1000, 5_000_000)
    assert five["gpu_hours"] == pytest.approx(1_840_748_544 * 5_000_000 / 5e14 / 3600)
    assert five["node_hours"] == pytest.approx(five["gpu_hours"] / 4)
    assert main(["recurrentgpt-medium-isoflops", "--budget", "20k", "--set", "train.global_batch_size=240",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["tokens_per_step"] == 240 * 1024


@pytest.mark.parametrize("argv, message", [
    (["--budget", "20x"], "'20x' is not 20k, 40k, Nk or a positive step count"),
    (["--budget", "0"], "'0' is not 20k"),
    (["--budget", "20k", "--mfu", "1.5"], "--mfu 1.5 must be <= 1"),
    (["--budget", "20k", "--mfu", "0"], "0 must be > 0"),
    (["--budget", "20k", "--solve", "n_loops", "--n-rec", "5"], "--budget does not apply to --solve"),
    (["--grid", "gpt2-small"], "--grid replaces the targets"),
])
def test_bad_budget_options_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_grid_costs_every_trained_run_and_totals_them(capsys):
    """--grid: one row per run of configs/experiments/ and budget; the totals are the rows' sums."""
    from rgpt_dist.studies.compare.grid import FLOP_MATCHED, flop_matched_cells, flop_matched_steps, grid, trained_flavours

    assert main(["--grid", "--budget", "20k,40k", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(f"{r['name']}-{r['budget']}" for r in rows) == sorted(grid())
    matched = {f"{c}-{FLOP_MATCHED}" for c in flop_matched_cells()}
    assert {r["name"] for r in rows} == set(trained_flavours()) | matched and len(rows) == len(grid())
    for r in rows:  # each on its config's steps
        assert r["steps"] == grid()[f"{r['name']}-{r['budget']}"]["train"]["max_steps"]
        if r["name"] in matched:
            assert r["steps"] == flop_matched_steps(r["name"].removesuffix(f"-{FLOP_MATCHED}"), {"20k": 20000, "40k": 40000}[r["budget"]])
    assert main(["--grid", "--budget", "20k"]) == 0
    total = sum(r["gpu_hours"] for r in rows if r["budget"] == "20k")
    assert f"whole grid at 20k: {len(rows) // 2} runs, {total:,.0f} GPU-hours" in capsys.readouterr().out


BAD_SIZES = [
    (["--seq-len", "0"], "argument --seq-len: 0 must be > 0"),
    (["--seq-len", "-5"], "argument --seq-len: -5 must be > 0"),
    (["--solve", "n_loops", "--n-rec", "0"], "argument --n-rec: 0 must be > 0"),
    (["--solve", "n_rec", "--n-loops", "-2"], "argument --n-loops: -2 must be > 0"),
    (["--solve", "n_loops", "--n-pre", "-1", "--n-rec", "5"], "argument --n-pre: -1 must be >= 0"),
    (["--solve", "n_loops", "--n-coda", "-1", "--n-rec", "5"], "argument --n-coda: -1 must be >= 0"),
    (["--budget", "0"], "'0' is not 20k, 40k, Nk or a positive step count"),
    (["--budget=-3k"], "'-3k' is not 20k, 40k, Nk or a positive step count"),
    (["--budget", "20k", "--tokens-per-step", "0"], "argument --tokens-per-step: 0 must be > 0"),
    (["--budget", "20k", "--gpu-peak", "inf"], "argument --gpu-peak: inf must be a finite number"),
    (["--budget", "20k", "--gpus-per-node", "-8"], "argument --gpus-per-node: -8 must be > 0"),
    (["gpt2-debug", "--set", "model.d_model=0"], "model.d_model=0 must be > 0"),
    (["gpt2-debug", "--set", "model.n_layer=-1"], "model.n_layer=-1 must be"),
    (["gpt2-debug", "--set", "model.n_head=0"], "model.n_head=0 must be > 0"),
]


@pytest.mark.parametrize("argv,message", BAD_SIZES, ids=[" ".join(a) for a, _ in BAD_SIZES])
def test_zero_or_negative_sizes_exit_2_naming_the_value(argv, message, capsys):
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's own exit for a bad argument
        status = e.code
    captured = capsys.readouterr()
    assert status == 2 and message in captured.err and "Traceback" not in captured.err
    assert captured.out == ""
