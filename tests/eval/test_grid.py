"""The grid summary on a fake runs directory: real config.yaml files (debug models named like grid
cells, and the real grid cells), hand-written metrics.jsonl records, finished / running / stale /
broken runs, the dense-vs-recurrent delta and the grid.md / grid.csv / grid.json files."""
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rgpt_dist.config import load_config
from rgpt_dist.studies.compare.grid import grid, write_yaml
from rgpt_dist.eval.grid import FAILED, FINISHED, RUNNING, markdown, summarize, summarize_run, write_table
from rgpt_dist.flops import paper_table1, forward_flops, param_count, train_flops

SHAPE = ["train.max_steps=100", "train.warmup_steps=10", "train.seq_len=128", "train.global_batch_size=16",
         "train.micro_batch_size=4"]
TOKENS_PER_STEP = 16 * 128


def make_run(root: Path, name: str, flavour: str | None, records=(), lines=()) -> Path:
    """A run directory as the trainer leaves it: config.yaml (unless flavour is None) and
    metrics.jsonl (records as JSON lines, then raw `lines`; absent when both are empty)."""
    run = root / name
    run.mkdir(parents=True)
    if flavour is not None:
        cfg = load_config(flavour, SHAPE + [f"log.run_dir={run}"])
        (run / "config.yaml").write_text(cfg.to_yaml())
    if records or lines:
        text = "".join(json.dumps(r) + "\n" for r in records) + "".join(line + "\n" for line in lines)
        (run / "metrics.jsonl").write_text(text)
    return run


def train_records(upto: int, every: int = 10, loss: float = 5.0):
    return [{"step": s, "loss": loss - s / 100, "r": 2, "tokens": s * TOKENS_PER_STEP}
            for s in range(every, upto + 1, every)]


def age(run: Path, seconds: float) -> None:
    """Make everything in the run look written `seconds` ago."""
    then = time.time() - seconds
    for p in [*run.rglob("*"), run]:
        os.utime(p, (then, then))


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "gpt2-small-20k", "gpt2-debug",
             train_records(100) + [{"step": 50, "val_loss": 3.4}, {"step": 100, "val_loss": 3.0}])
    make_run(root, "recurrentgpt-small-isoflops-20k", "recurrentgpt-debug",
             train_records(100) + [{"step": 50, "val_loss": 3.5, "early_exit": [4.5, 3.8, 3.5]},
                                   {"step": 100, "val_loss": 2.9, "early_exit": [4.0, 3.2, 2.9]}])
    make_run(root, "recurrentgpt-small-isoparams-20k", "recurrentgpt-debug", train_records(40))  # running, no eval yet
    make_run(root, "gpt2-medium-20k", "gpt2-debug", train_records(20), lines=['{"step": 30, "loss": 4.', "[1, 2]"])
    age(make_run(root, "recurrentgpt-medium-isoflops-20k", "recurrentgpt-debug", train_records(30)), 7200)
    make_run(root, "recurrentgpt-large-isoflops-20k", None, train_records(10))  # no config.yaml
    (root / "recurrentgpt-large-isoflops-20k" / "config.yaml").mkdir()  # and something unreadable in its place
    (root / "notes").mkdir()  # not a run: ignored
    (root / "gpt2-small-20k" / "checkpoints" / "step_00000100").mkdir(parents=True)
    return root


def by_name(rows):
    return {r["name"]: r for r in rows}


def test_rows_carry_the_flops_modules_numbers_for_the_runs_own_config(runs):
    rows = by_name(summarize(runs))
    assert set(rows) == {"gpt2-small-20k", "recurrentgpt-small-isoflops-20k", "recurrentgpt-small-isoparams-20k",
                         "gpt2-medium-20k", "recurrentgpt-medium-isoflops-20k", "recurrentgpt-large-isoflops-20k"}
    for name, flavour, layout in (("gpt2-small-20k", "gpt2-debug", "4L"),
                                  ("recurrentgpt-small-isoflops-20k", "recurrentgpt-debug", "1+1x2+1")):
        row, model = rows[name], load_config(flavour).model
        assert (row["layout"], row["seq_len"], row["max_steps"], row["budget"]) == (layout, 128, 100, "100")
        assert row["params"] == param_count(model) and row["params_no_embedding"] == param_count(model, embeddings=False)
        assert row["fwd_flops_per_token"] == forward_flops(model, 128)
        assert row["train_flops_per_token"] == train_flops(model, 128)
        assert row["train_flops_total"] == pytest.approx(train_flops(model, 128) * TOKENS_PER_STEP * 100)
        assert (row["steps_done"], row["tokens_seen"]) == (100, 100 * TOKENS_PER_STEP)
    rec = rows["recurrentgpt-small-isoflops-20k"]
    assert (rec["scale"], rec["setting"], rec["method"], rec["expected_r"]) == ("small", "isoFLOPs", "RecurrentGPT", 1.5)
    assert rows["gpt2-small-20k"]["setting"] == "dense" and rows["gpt2-small-20k"]["last_checkpoint"] == 100
    assert rows["recurrentgpt-small-isoparams-20k"]["setting"] == "isoParams"


def test_last_eval_record_and_early_exit_curve(runs):
    rows = by_name(summarize(runs))
    rec, dense = rows["recurrentgpt-small-isoflops-20k"], rows["gpt2-small-20k"]
    assert (rec["val_loss"], rec["val_step"], rec["early_exit"]) == (2.9, 100, [4.0, 3.2, 2.9])
    assert rec["early_exit_str"] == "4.000 3.200 2.900"
    assert (dense["val_loss"], dense["early_exit"], dense["early_exit_str"]) == (3.0, None, None)
    assert rec["train_loss"] == pytest.approx(4.0)
    running = rows["recurrentgpt-small-isoparams-20k"]
    assert running["val_loss"] is None and running["early_exit"] is None and running["delta_vs_dense"] is None


def test_statuses_of_finished_running_stale_and_broken_runs(runs):
    rows = by_name(summarize(runs))
    status = {n: (r["status"], r["progress"]) for n, r in rows.items()}
    assert status["gpt2-small-20k"] == (FINISHED, "100/100")
    assert status["recurrentgpt-small-isoparams-20k"] == (RUNNING, "40/100")
    assert rows["recurrentgpt-small-isoparams-20k"]["problem"] is None
    assert status["recurrentgpt-medium-isoflops-20k"] == (FAILED, "30/100")
    assert "stopped at step 30/100" in rows["recurrentgpt-medium-isoflops-20k"]["problem"]
    broken = rows["gpt2-medium-20k"]
    path = runs / "gpt2-medium-20k" / "metrics.jsonl"
    assert broken["status"] == FAILED and f"{path}:3: corrupt record" in broken["problem"]
    assert f"{path}:4: record without an integer step" in broken["problem"]
    assert broken["steps_done"] == 20 and broken["params"] is not None  # the good lines still count
    no_config = rows["recurrentgpt-large-isoflops-20k"]
    assert no_config["status"] == FAILED and "config.yaml" in no_config["problem"]
    assert (no_config["params"], no_config["progress"], no_config["budget"]) == (None, "10/?", "20k")
    assert no_config["tokens_seen"] == 10 * TOKENS_PER_STEP  # from the records when there is no config
    stale_ignored = by_name(summarize(runs, stale_after_s=None))["recurrentgpt-medium-isoflops-20k"]
    assert stale_ignored["status"] == RUNNING


def test_a_run_with_only_a_fresh_config_is_running_and_a_stale_one_is_not(tmp_path):
    run = make_run(tmp_path, "gpt2-small-20k", "gpt2-debug")
    assert summarize_run(run)["status"] == RUNNING and summarize_run(run)["steps_done"] == 0
    age(run, 7200)
    row = summarize_run(run)
    assert row["status"] == FAILED and "no metrics.jsonl" in row["problem"]
    assert [r["name"] for r in summarize(run)] == ["gpt2-small-20k"]  # runs_dir may be one run
    with pytest.raises(FileNotFoundError):
        summarize(tmp_path / "absent")


def test_delta_against_the_dense_run_of_the_same_scale_and_budget(runs):
    rows = by_name(summarize(runs))
    rec = rows["recurrentgpt-small-isoflops-20k"]
    assert rec["dense_run"] == "gpt2-small-20k" and rec["delta_vs_dense"] == pytest.approx(-0.1)
    dense_fwd = rows["gpt2-small-20k"]["fwd_flops_per_token"]
    assert rec["fwd_ratio_to_dense"] == pytest.approx(rec["fwd_flops_per_token"] / dense_fwd)
    assert rows["gpt2-small-20k"]["delta_vs_dense"] is None
    assert rows["recurrentgpt-medium-isoflops-20k"]["dense_run"] == "gpt2-medium-20k"  # dense has no eval yet
    assert rows["recurrentgpt-medium-isoflops-20k"]["delta_vs_dense"] is None
    order = [r["name"] for r in summarize(runs)]
    assert order.index("gpt2-small-20k") < order.index("recurrentgpt-small-isoflops-20k") < order.index("gpt2-medium-20k")


def test_real_grid_cells_carry_the_paper_columns(tmp_path):
    root = tmp_path / "runs"
    for path in write_yaml(tmp_path / "configs"):
        if path.stem in ("gpt2-medium-20k", "recurrentgpt-medium-isoflops-20k", "recurrentgpt-large-isoparams-40k"):
            (root / path.stem).mkdir(parents=True)
            (root / path.stem / "config.yaml").write_text(load_config(path).to_yaml())
    rows = by_name(summarize(root))
    med = rows["recurrentgpt-medium-isoflops-20k"]
    assert (med["layout"], med["budget"], med["max_steps"], med["scale"]) == ("2+5x4+2", "20k", 20000, "medium")
    assert (med["paper_params"], med["paper_flops_fwd"]) == paper_table1()["recurrentgpt-medium-isoflops"]
    assert med["paper_val_loss"] == 2.89 and rows["gpt2-medium-20k"]["paper_val_loss"] == 2.84
    assert med["params"] == pytest.approx(171.1e6, rel=1e-3) and any("vs paper" in f for f in med["flags"])
    big = rows["recurrentgpt-large-isoparams-40k"]
    assert big["budget"] == "40k" and big["paper_val_loss"] is None  # Table 1 is the 20k budget
    assert big["paper_params"] == paper_table1()["recurrentgpt-large-isoparams"][0]
    assert rows["gpt2-medium-20k"]["train_flops_total"] == pytest.approx(
        train_flops(load_config("gpt2-medium").model, 1024) * 480 * 1024 * 20000)
    assert len(grid()) == 2 * (8 + 5 + 3 + 3 + 5 + 3) and all(r["status"] == RUNNING for r in rows.values())


def test_competitors_take_their_table1_rows(tmp_path):
    """Within a cell: the dense baseline, then Table 1's method order (Poisson, Ouro, RRT,
    RecurrentGPT); RRT's paper Params carry '+LoRA'."""
    root = tmp_path / "runs"
    cell = ["gpt2-small-20k", "recurrentgpt-small-isoflops-20k", "poisson-small-isoflops-20k", "rrt-small-isoflops-20k",
            "ouro-small-isoflops-20k"]
    for path in write_yaml(tmp_path / "configs"):
        if path.stem in cell:
            (root / path.stem).mkdir(parents=True)
            (root / path.stem / "config.yaml").write_text(load_config(path).to_yaml())
    rows = summarize(root)
    assert [r["method"] for r in rows] == ["GPT-2", "Heavy-tail Poisson", "Ouro", "RRT", "RecurrentGPT"]
    assert {r["setting"] for r in rows[1:]} == {"isoFLOPs"} and rows[0]["setting"] == "dense"
    assert by_name(rows)["poisson-small-isoflops-20k"]["paper_val_loss"] == 3.23
    assert by_name(rows)["ouro-small-isoflops-20k"]["paper_val_loss"] == 3.19
    table = markdown(rows)
    assert "36M+LoRA, 3.14" in table and "Heavy-tail Poisson small (`poisson-small-isoflops-20k`)" in table


def test_markdown_csv_and_json_files(runs, tmp_path):
    rows = summarize(runs)
    paths = write_table(rows, tmp_path / "out")
    assert [p.name for p in paths] == ["grid.md", "grid.csv", "grid.json"]
    md = (tmp_path / "out" / "grid.md").read_text()
    assert "## isoFLOPs regime" in md and "## isoParams regime" in md and "## Problems" in md
    iso_flops = md.split("## isoFLOPs regime")[1].split("## isoParams regime")[0]
    dense_line = next(line for line in iso_flops.splitlines() if "`gpt2-small-20k`" in line)
    rec_line = next(line for line in iso_flops.splitlines() if "`recurrentgpt-small-isoflops-20k`" in line)
    assert iso_flops.index(dense_line) < iso_flops.index(rec_line)
    assert "GPT-2 small baseline" in dense_line and "| 4L |" in dense_line and "finished 100/100" in dense_line
    assert "| 1+1x2+1 |" in rec_line and "| 2.9000 | -0.1000 |" in rec_line and "4.000 3.200 2.900" in rec_line
    assert "`gpt2-small-20k`" in md.split("## isoParams regime")[1]  # the dense baseline heads each regime
    assert f"{runs / 'gpt2-medium-20k' / 'metrics.jsonl'}:3" in md.split("## Problems")[1]
    with open(tmp_path / "out" / "grid.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["name"] for r in table] == [r["name"] for r in rows]
    rec = next(r for r in table if r["name"] == "recurrentgpt-small-isoflops-20k")
    assert rec["early_exit"] == "4.000 3.200 2.900" and float(rec["delta_vs_dense"]) == pytest.approx(-0.1)
    assert int(rec["params"]) == param_count(load_config("recurrentgpt-debug").model) and rec["status"] == FINISHED
    assert json.loads((tmp_path / "out" / "grid.json").read_text()) == rows


def test_module_imports_without_torch():
    code = "import sys, rgpt_dist.eval.grid; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_ablation_runs_get_their_own_tables_with_deltas(tmp_path, capsys):
    """rgpt-eval grid on ablation runs (rgpt_dist.studies.ablation.grid' names) and the main grid's runs
    they reuse: Fig. 5's rows each against the row it builds on ('4b' against '3', like '4') and the
    dense baseline; a sweep against its default; the seeds' mean and spread; grid.md leaves them out."""
    root = tmp_path / "runs"
    losses = {"gpt2-small-20k": 3.15, "ablation-fig5-2-recurrence": 3.30, "ablation-fig5-3-prelude-coda": 3.25,
              "ablation-fig5-4-state-noise": 3.22, "ablation-fig5-4b-noise-at-init": 3.24,
              "ablation-fig5-5-reinjection": 3.20, "recurrentgpt-small-isoflops-20k": 3.14,
              "ablation-b6-gatebias0": 3.16, "ablation-b1-seed42-recurrentgpt": 3.15,
              "ablation-b1-seed123-recurrentgpt": 3.13}
    for name, loss in losses.items():
        flavour = "gpt2-debug" if name.startswith("gpt2") else "recurrentgpt-debug"
        make_run(root, name, flavour, train_records(100) + [{"step": 100, "val_loss": loss}])
    from launcher.eval import main as rgpt_eval

    assert rgpt_eval(["grid", str(root), "--out", str(tmp_path / "out")]) == 0
    assert "ablations.md" in capsys.readouterr().out  # among the files it says it wrote
    text = (tmp_path / "out" / "ablations.md").read_text()
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "| +0.1500 | " in lines["2-recurrence"] and "-0.0500 | +0.1000" in lines["3-prelude-coda"]
    assert "-0.0300 | +0.0700" in lines["4-state-noise"] and "-0.0100 | +0.0900" in lines["4b-noise-at-init"]
    assert "-0.0200 | +0.0500" in lines["5-reinjection"] and "-0.0600 | -0.0100" in lines["6-gate"]
    assert "| +0.0200 |" in lines["gatebias0"] and "| 3.1400 | +0.0000 |" in lines["default"]
    assert "| recurrentgpt | seed123, seed1337, seed42 | 3.1300, 3.1400, 3.1500 | 3.1400 | 0.0100 |" in text
    grid_md = (tmp_path / "out" / "grid.md").read_text()
    assert "8 ablation runs: see ablations.md." in grid_md and "ablation-fig5" not in grid_md


# ---- hostile run directories: the bad run is reported, the others' tables are written --------
HOSTILE_LINES = [
    '{"step": 5, "val_loss": "abc"}',                         # 1: a loss that is a string
    '{"step": 6, "early_exit": "xyz"}',                       # 2: a curve that is not a list
    '{"step": 7, "early_exit": [1.0, "two"]}',                # 3: a curve with a string
    '{"step": true, "loss": 1.0}',                            # 4: a bool step
    "[" * 100_000 + "]" * 100_000,                            # 5: nested beyond the parser's stack
    '{"step": ' + "9" * 5000 + "}",                           # 6: an integer beyond int()'s digit limit
    '{"step": ' + "9" * 40 + ', "loss": 1.0}',                # 7: a step no run has
    '{"step": 9, "loss": 1.0, "pad": "' + "x" * (1 << 20) + '"}',  # 8: a line over 1 MiB
    '{"step": 10, "val_loss": NaN, "early_exit": [Infinity, 3.0]}',  # 9: non-finite numbers (accepted)
]


def _strict(text: str):
    """json.loads refusing NaN / Infinity tokens (what a non-Python reader does)."""
    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def test_hostile_metrics_lines_are_reported_by_line_and_the_grid_still_written(tmp_path, capsys):
    from launcher.eval import main

    root = tmp_path / "runs"
    make_run(root, "gpt2-small-20k", "gpt2-debug", train_records(100) + [{"step": 100, "val_loss": 3.0}])
    bad = make_run(root, "recurrentgpt-small-isoflops-20k", "recurrentgpt-debug", train_records(20),
                   lines=HOSTILE_LINES)
    start = time.perf_counter()
    assert main(["grid", str(root), "--out", str(tmp_path / "out")]) == 0
    assert time.perf_counter() - start < 30
    rows = by_name(_strict((tmp_path / "out" / "grid.json").read_text()))
    assert rows["gpt2-small-20k"]["status"] == FINISHED and rows["gpt2-small-20k"]["val_loss"] == 3.0
    row, path = rows["recurrentgpt-small-isoflops-20k"], bad / "metrics.jsonl"
    assert row["status"] == FAILED and row["steps_done"] == 20
    at = {n: f"{path}:{n + 2}: " for n in range(1, 10)}  # HOSTILE_LINES follow two good records
    for n in (1, 2, 3, 7):
        assert at[n] + "record with " in row["problem"]
    assert at[4] + "record without an integer step" in row["problem"]
    assert at[5] + "corrupt record (nested too deeply or a number too long)" in row["problem"]
    assert at[6] + "corrupt record" in row["problem"]
    assert at[8] + "record longer than 1048576 bytes, skipped" in row["problem"]
    assert at[9] not in row["problem"] and row["val_loss"] is None and row["early_exit"] == [None, 3.0]
    md = (tmp_path / "out" / "grid.md").read_text()
    assert "`gpt2-small-20k`" in md and at[8] + "record longer" in md and len(md) < 20_000


def test_a_run_that_cannot_be_summarized_is_one_failed_row(tmp_path, monkeypatch):
    import rgpt_dist.eval.grid as grid_module
    root = tmp_path / "runs"
    make_run(root, "gpt2-small-20k", "gpt2-debug", train_records(100))
    make_run(root, "gpt2-medium-20k", "gpt2-debug", train_records(100))
    real = grid_module.summarize_run

    def flaky(run_dir, stale_after_s=3600.0):
        if Path(run_dir).name == "gpt2-medium-20k":
            raise OSError(5, "Input/output error")
        return real(run_dir, stale_after_s)
    monkeypatch.setattr(grid_module, "summarize_run", flaky)
    rows = by_name(summarize(root))
    assert rows["gpt2-small-20k"]["status"] == FINISHED
    bad = rows["gpt2-medium-20k"]
    assert bad["status"] == FAILED and "unreadable run (OSError: [Errno 5] Input/output error)" in bad["problem"]
    assert "gpt2-medium-20k" in markdown(list(rows.values()))


def _tables(md: str) -> list[list[str]]:
    """Each Markdown table of `md`: its consecutive lines starting with '|'."""
    tables, current = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables, current = tables + [current], []
    return tables


def _cells(line: str) -> int:
    """Cell borders a Markdown renderer sees: pipes not escaped by a backslash."""
    return sum(1 for i, c in enumerate(line) if c == "|" and (i == 0 or line[i - 1] != "\\"))


def test_pipes_and_line_breaks_in_names_and_problems_cannot_break_the_tables(tmp_path):
    from rgpt_dist.studies.ablation.table import markdown as ablation_markdown
    root = tmp_path / "runs"
    make_run(root, "gpt2-small-20k", "gpt2-debug", train_records(100) + [{"step": 100, "val_loss": 3.0}])
    make_run(root, "gpt2-small|evil\n| x | y |-20k", "gpt2-debug", train_records(100), lines=["{bad|json"])
    make_run(root, "ablation-fig5-2|x\n| a |", "gpt2-debug", train_records(100) + [{"step": 100, "val_loss": 3.1}])
    rows = summarize(root)
    for text in (markdown(rows), ablation_markdown(rows)):
        tables = _tables(text)
        assert tables and all(_cells(line) == _cells(t[0]) for t in tables for line in t)
    md = markdown(rows)
    assert "gpt2-small&#124;evil &#124; x &#124; y &#124;-20k" in md
    assert "2&#124;x &#124; a &#124;" in ablation_markdown(rows)
    problems = md.split("## Problems")[1]
    assert "corrupt record" in problems and not any(line.startswith("| x") for line in md.splitlines())


def test_an_alias_bomb_config_yaml_fails_its_run_only(tmp_path):
    from tests.config.test_config_edges import _laughs
    root = tmp_path / "runs"
    make_run(root, "gpt2-small-20k", "gpt2-debug", train_records(100))
    bomb = make_run(root, "gpt2-medium-20k", None, train_records(10))
    (bomb / "config.yaml").write_text(_laughs())
    start = time.perf_counter()
    rows = by_name(summarize(root))
    assert time.perf_counter() - start < 10 and rows["gpt2-small-20k"]["status"] == FINISHED
    bad = rows["gpt2-medium-20k"]
    assert bad["status"] == FAILED and f"{bomb / 'config.yaml'}: ConfigError" in bad["problem"]
    assert "expands to more than 100000 nodes through aliases" in bad["problem"] and len(bad["problem"]) < 1000


def test_both_flops_columns_and_the_equal_compute_flags(tmp_path):
    """Issue #29: every row carries forward and training FLOPs per token and their ratios to the cell's
    dense run; a ratio off 1 by more than 5 % is flagged in the row, marked '!' in grid.md and listed.
    Ratios recomputed here from rgpt_dist.flops on the runs' configs (MoR runs fewer FLOPs than the
    dense model per forward, Ouro trains on many more: every iteration is read out)."""
    names = {"gpt2-small-20k": "gpt2-debug", "mor-small-isoflops-20k": "mor-debug",
             "ouro-small-isoflops-20k": "ouro-debug"}
    for name, flavour in names.items():
        make_run(tmp_path, name, flavour, train_records(100))
    # a FLOP-matched run trains longer (its own max_steps) and is still compared within its cell's budget
    matched = make_run(tmp_path, "mor-small-isoflops-flopmatched-20k", None, train_records(100))
    cfg = load_config("mor-debug", SHAPE + ["train.max_steps=141", f"log.run_dir={matched}"])
    (matched / "config.yaml").write_text(cfg.to_yaml())
    rows = by_name(summarize(tmp_path))
    flop = rows["mor-small-isoflops-flopmatched-20k"]
    assert flop["max_steps"] == 141 and flop["dense_run"] == "gpt2-small-20k" and flop["train_ratio_to_dense"] is not None
    assert list(rows)[:2] == ["gpt2-small-20k", "mor-small-isoflops-20k"]  # one cell: the dense run first
    dense = load_config("gpt2-debug", SHAPE).model
    for name in ("mor-small-isoflops-20k", "ouro-small-isoflops-20k"):
        cfg, row = load_config(names[name], SHAPE).model, rows[name]
        fwd, train = forward_flops(cfg, 128) / forward_flops(dense, 128), train_flops(cfg, 128) / train_flops(dense, 128)
        assert row["fwd_ratio_to_dense"] == pytest.approx(fwd) and row["train_ratio_to_dense"] == pytest.approx(train)
        flagged = f"training FLOPs/token {train:.2f}x the dense model's" in row["flags"]
        assert flagged == (abs(train - 1) > 0.05)
    assert rows["ouro-small-isoflops-20k"]["train_ratio_to_dense"] > 1.5  # the debug shapes: MoR's is 0.998
    assert rows["gpt2-small-20k"]["train_ratio_to_dense"] is None  # the reference itself
    md = markdown(list(rows.values()))
    assert "| FLOPs/token fwd | FLOPs/token train |" in md and "## Not at equal compute" in md
    ouro = rows["ouro-small-isoflops-20k"]
    assert f"({ouro['train_ratio_to_dense']:.2f}x !)" in md and "- `ouro-small-isoflops-20k`: " in md
