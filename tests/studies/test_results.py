"""The study results the docs report, rebuilt from the run records committed under results/ (config,
metrics and evaluation of every run, no checkpoint), and compared with the tables in the docs: a
table in the docs that its records do not give fails here.

    results/compare-long/  make compare-long: docs/evaluation.md's ordering table
    results/rlt/           make rlt: docs/families.md's per-seed parity and swaps-S5 tables
    results/rlt-first-machine/, results/rlt-float-path/, results/rlt-buckets/  make rlt's parity runs on
                           other float paths (the last with length buckets)
    results/thinking/      make thinking: docs/thinking.md's frontier
    results/algorithmic/   make algorithmic: docs/algorithmic.md's table
    results/compare/, results/ablation/  make compare, make ablation: docs/evaluation.md's CPU tables
    results/phi/           make phi: docs/evaluation.md's fit of phi at CPU scale
    results/quickstart-eval/, results/compare-diagnostics/  the JSON files of `make quickstart-eval` and of
                           Appendix E on make compare's RecurrentGPT: README.md's and docs/evaluation.md's figures
"""
import json
import math
import re
import shutil
import statistics
from pathlib import Path

import pytest
import yaml

from rgpt_dist.eval.grid import summarize
from rgpt_dist.studies import study
from rgpt_dist.studies.base import Context

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"


def _table_rows(doc: str, header_start: str) -> list[list[str]]:
    """The body rows (cells stripped) of the first Markdown table in docs/<doc> whose header line
    starts with header_start."""
    lines = (ROOT / "docs" / doc).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().strip("*") for c in line.strip("|").split("|")])
    return rows


def _restored(name: str, tmp_path: Path) -> Path:
    """The records of results/<name> copied into a fresh study directory, as `rgpt study` restores them."""
    out = tmp_path / name
    shutil.copytree(RESULTS / name, out)
    return out


def _recorded(name: str, runs: list) -> None:
    """results/<name> holds a record of every planned run, and nothing else."""
    assert sorted(p.name for p in (RESULTS / name).iterdir()) == sorted(r.name for r in runs)


def _flat(path: Path) -> str:
    """A Markdown file's text with every run of whitespace as one space (claims wrap across lines)."""
    return " ".join(path.read_text().split())


def test_the_long_comparisons_ordering_is_its_records(tmp_path):
    runs = study("compare-long").plan("long")
    rows = _rows_by_run("compare-long", tmp_path, preset="long")
    by_method: dict[str, dict[int, dict]] = {}
    for run in runs:
        by_method.setdefault(rows[run.name]["method"], {})[run.seed] = rows[run.name]
    doc = _table_rows("evaluation.md", "| rank | method | seed 1337 | seed 42 |")
    assert len(doc) == len(by_method) == 6
    means = []
    for rank, method, s1337, s42, mean, sd, spread, gflops, _paper, _paper_rank in doc:
        seeds = next(v for m, v in by_method.items() if method.startswith(m))
        losses = [seeds[1337]["val_loss"], seeds[42]["val_loss"]]
        assert [s1337, s42] == [f"{x:.4f}" for x in losses], method
        assert mean == f"{statistics.fmean(losses):.4f}" and sd == f"{statistics.stdev(losses):.4f}", method
        assert spread == f"{max(losses) - min(losses):.4f}", method
        assert gflops == f"{seeds[1337]['train_flops_per_token'] / 1e9:.4f}", method
        means.append(statistics.fmean(losses))
    assert means == sorted(means)  # ranked by the mean


def _final(record: Path, length: int) -> float:
    return json.loads((record / "eval-last" / "eval.json").read_text())["test"][str(length)]["final"]


def _last_loss(record: Path) -> float:
    rows = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["loss"] for r in rows if "loss" in r][-1]


def _cell(record: Path, lengths: tuple[int, ...]) -> str:
    """A per-seed table's cell: the final answer's (state's) accuracy at each length, then the last
    training loss, e.g. "100.00 / 51.17 % (1.2e-07)"."""
    at = [f"{100 * _final(record, n):.2f}" for n in lengths]
    return f"{' / '.join(at)} % ({_last_loss(record):.2g})"


def _parity_cell(record: Path) -> str:
    """A parity table's cell: final-bit accuracy at 64 / 256 bits and the last training loss."""
    return _cell(record, (64, 256))


RLT_ROWS = {"RLT-1 2 + 2 (`rlt-debug`)": "rlt1-2+2", "RLT-0 2 + 2": "rlt0-2+2",
            "Transformer, 4 layers (`rlt-transformer-debug`)": "transformer-4"}
RLT_SEEDS = (42, 43, 44)


@pytest.fixture(scope="module")
def rlt_table(tmp_path_factory) -> str:
    """make rlt's report (table.md) rebuilt once from every record of results/rlt."""
    out = _restored("rlt", tmp_path_factory.mktemp("rlt"))
    return study("rlt").report(Context(out=out), study("rlt").plan("cpu"))["md"].read_text()


def test_the_rlt_parity_table_is_its_records(rlt_table):
    """Per seed: final-bit accuracy at 64 / 256 bits of the last checkpoint, and the last training
    loss (docs/families.md), from results/rlt; and the study's report rebuilds its table from them."""
    runs = study("rlt").plan("cpu")
    _recorded("rlt", runs)
    doc = _table_rows("families.md", "| model | seed 42 | seed 43 | seed 44 |")
    assert [row[0] for row in doc] == list(RLT_ROWS)
    for label, *cells in doc:
        assert len(cells) == len(RLT_SEEDS), label
        for seed, text in zip(RLT_SEEDS, cells):
            record = RESULTS / "rlt" / f"parity-{RLT_ROWS[label]}-s{seed}"
            want = _parity_cell(record)
            assert text == want, (label, seed)
    at_256 = [100 * _final(RESULTS / "rlt" / f"parity-rlt1-2+2-s{seed}", 256) for seed in RLT_SEEDS]
    mean_sd = f"{statistics.mean(at_256):.2f} ± {statistics.stdev(at_256):.2f}"      # three seeds: no (n=k)
    assert f"| Parity (256) | {mean_sd} |" in rlt_table


def test_the_rlt_s5_table_is_its_records(rlt_table):
    """make rlt's swaps-S5 runs (results/rlt/s5_swaps-*): docs/families.md's per-seed row of each model is
    its records', and the study's report holds the swaps-S5 row at its longest length, 512 operations."""
    doc = _table_rows("families.md", "| model (swaps-S5) | seed 42 | seed 43 | seed 44 |")
    assert [row[0] for row in doc] == list(RLT_ROWS)
    for label, *cells in doc:
        assert len(cells) == len(RLT_SEEDS), label
        for seed, text in zip(RLT_SEEDS, cells):
            record = RESULTS / "rlt" / f"s5_swaps-{RLT_ROWS[label]}-s{seed}"
            assert text == _cell(record, (32, 64, 256)), (label, seed)   # final-state accuracy, last loss
    at_512 = [100 * _final(RESULTS / "rlt" / f"s5_swaps-rlt1-2+2-s{seed}", 512) for seed in RLT_SEEDS]
    assert f"| S5, swaps (512) | {statistics.mean(at_512):.2f} ± {statistics.stdev(at_512):.2f} |" in rlt_table


def _config_but_where_it_ran(config: Path) -> dict:
    """A run's config but for where it ran: its log section and the checkout's corpus path (data.paths,
    which an algorithmic task's generated stream does not read)."""
    fields = {k: v for k, v in yaml.safe_load(config.read_text()).items() if k != "log"}
    return {**fields, "data": {k: v for k, v in fields["data"].items() if k != "paths"}}


def test_the_rlt_float_path_table_is_its_records():
    """make rlt's parity runs on other float paths: as first recorded on an earlier machine
    (results/rlt-first-machine/, all nine), RLT-1's three under other kernels (results/rlt-float-path/)
    and with length buckets (results/rlt-buckets/; their configs: the next test): the same configs as
    results/rlt's but for where they ran, and docs/families.md's per-seed row of RLT-1 on each path
    is its records'."""
    doc = _table_rows("families.md", "| float path | seed 42 | seed 43 | seed 44 |")
    folders = ("rlt-first-machine", "rlt", "rlt-float-path", "rlt-buckets")
    assert [row[0] for row in doc] == ["the first machine (`results/rlt-first-machine/`)",
                                       "this machine, `make rlt` (`results/rlt/`)",
                                       "this machine, MKL CBWR + ATen AVX2 (`results/rlt-float-path/`)",
                                       "this machine, length buckets (`results/rlt-buckets/`)"]
    for (_, *cells), folder in zip(doc, folders):
        for seed, text in zip(RLT_SEEDS, cells):
            assert text == _parity_cell(RESULTS / folder / f"parity-rlt1-2+2-s{seed}"), (folder, seed)
    first = sorted(p.name for p in (RESULTS / "rlt-first-machine").iterdir() if p.is_dir())
    assert first == sorted(r.name for r in study("rlt").plan("cpu") if r.name.startswith("parity-"))
    float_path = [f"parity-rlt1-2+2-s{seed}" for seed in RLT_SEEDS]
    for folder, names in (("rlt-first-machine", first), ("rlt-float-path", float_path)):
        for name in names:
            assert _config_but_where_it_ran(RESULTS / folder / name / "config.yaml") == _config_but_where_it_ran(
                RESULTS / "rlt" / name / "config.yaml"), (folder, name)


def test_the_rlt_bucket_runs_are_the_study_s_but_for_the_buckets():
    """results/rlt-buckets/: RLT-1's three seeds and the baselines' seed 42 on both tasks, each config
    results/rlt's but for where it ran and four sorted micro-batches of 64; docs/families.md's
    swaps-S5 float-path rows are their records' (the parity row: the test above)."""
    names = sorted(f"{task}-{model}-s{seed}" for task in ("parity", "s5_swaps")
                   for model, seeds in (("rlt1-2+2", RLT_SEEDS), ("rlt0-2+2", (42,)), ("transformer-4", (42,)))
                   for seed in seeds)
    assert sorted(p.name for p in (RESULTS / "rlt-buckets").iterdir() if p.is_dir()) == names
    for name in names:
        config = _config_but_where_it_ran(RESULTS / "rlt-buckets" / name / "config.yaml")
        assert config["train"].pop("micro_batch_size") == 64 and config["data"].pop("task_sort_by_length") is True
        config["train"]["micro_batch_size"] = 256
        assert config == _config_but_where_it_ran(RESULTS / "rlt" / name / "config.yaml"), name
    doc = _table_rows("families.md", "| swaps-S5, RLT-1 2 + 2 | seed 42 | seed 43 | seed 44 |")
    assert [row[0] for row in doc] == ["this machine, `make rlt` (`results/rlt/`)",
                                       "this machine, length buckets (`results/rlt-buckets/`)"]
    for (_, *cells), folder in zip(doc, ("rlt", "rlt-buckets")):
        for seed, text in zip(RLT_SEEDS, cells):
            assert text == _cell(RESULTS / folder / f"s5_swaps-rlt1-2+2-s{seed}", (32, 64, 256)), (folder, seed)


def test_the_thinking_frontier_is_its_records(tmp_path):
    runs = study("thinking").plan("cpu")
    _recorded("thinking", runs)
    out = _restored("thinking", tmp_path)
    paths = study("thinking").report(Context(out=out), runs)
    rebuilt = [line for line in paths["md"].read_text().splitlines() if re.match(r"\| \d+ ", line)]
    doc = (ROOT / "docs" / "thinking.md").read_text()
    start = doc.index("| difficulty \\ steps |")
    documented = [line for line in doc[start:].split("\n\n")[0].splitlines() if re.match(r"\| \d+ ", line)]
    assert documented and documented == rebuilt


def _report_tables(md: str) -> dict[str, dict[str, dict[str, str]]]:
    """A study report's tables: section heading -> first cell of each body row -> header -> cell."""
    tables: dict[str, dict[str, dict[str, str]]] = {}
    heading, header = "", None
    for line in md.splitlines():
        if line.startswith("## "):
            heading, header = line[3:], None
        elif line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            else:
                tables.setdefault(heading, {})[cells[0]] = dict(zip(header, cells))
        elif not line.strip():
            header = None
    return tables


def test_the_algorithmic_table_is_its_records(tmp_path):
    """make algorithmic (the Transformer 4 at CPU scale, results/algorithmic): docs/algorithmic.md's table
    is the report's cells at its lengths, rebuilt from the records."""
    runs = study("algorithmic").plan("cpu")
    _recorded("algorithmic", runs)
    report = study("algorithmic").report(Context(out=_restored("algorithmic", tmp_path)), runs)
    tables = _report_tables(report["md"].read_text())
    in_dist = next(v for k, v in tables.items() if k.startswith("In-distribution"))
    model = next(h for h in in_dist["Parity"] if h != "Task")
    row = next(iter(tables["Parity: final-label / final-state accuracy"].values()))
    s5 = next(iter(tables["S5, swaps: final-label / final-state accuracy"].values()))
    token = next(iter(next(v for k, v in tables.items() if k.startswith("S5, swaps: token")).values()))
    lengths = ("32", "64", "256", "512")
    want = [["Parity", in_dist["Parity"][model], *(row.get(n, "") for n in lengths)],
            ["S5, swaps (final state)", in_dist["S5, swaps"][model], *(s5[n] for n in lengths)],
            ["S5, swaps (prefix token)", "", *(token[n] for n in lengths)]]
    assert _table_rows("algorithmic.md", "| Task (test length) | in-distribution validation |") == want


def _rows_by_run(name: str, tmp_path: Path, preset: str = "cpu") -> dict[str, dict]:
    """The grid rows of results/<name> by run name: every planned run recorded, and finished."""
    runs = study(name).plan(preset)
    _recorded(name, runs)
    rows = {r["name"]: r for r in summarize(_restored(name, tmp_path), stale_after_s=None)}
    assert all(r["status"] == "finished" for r in rows.values())
    return rows


def _wall(name: str, run: str) -> str:
    return f"{round(json.loads((RESULTS / name / run / 'record.json').read_text())['wall_s'])} s"


COMPARE_ROWS = {"GPT-2": "gpt2-small-seed1337", "MoR": "mor-small-isoflops-seed1337",
                "Heavy-tail Poisson": "poisson-small-isoflops-seed1337", "Ouro": "ouro-small-isoflops-seed1337",
                "RRT": "rrt-small-isoflops-seed1337", "RecurrentGPT (seed 1337)": "recurrentgpt-small-isoflops-seed1337",
                "RecurrentGPT (seed 42)": "recurrentgpt-small-isoflops-seed42"}


def test_the_compare_table_is_its_records(tmp_path):
    """make compare (results/compare): docs/evaluation.md's per-model row (layout, parameters, training
    GFLOPs per token, the loss at R and its difference from the dense run, the early exit at r = 0, 1,
    2, 5, 10, the run's wall time) is its record's."""
    rows = _rows_by_run("compare", tmp_path)
    doc = _table_rows("evaluation.md", "| method | layout | params | train GFLOPs/token |")
    assert [row[0] for row in doc] == list(COMPARE_ROWS)
    for method, layout, params, gflops, loss, delta, early, wall in doc:
        r = rows[COMPARE_ROWS[method]]
        exits = "" if r["early_exit"] is None else " ".join(f"{r['early_exit'][k]:.3f}" for k in (0, 1, 2, 5, 10))
        want = [r["layout"], f"{r['params'] / 1e6:.2f}M", f"{r['train_flops_per_token'] / 1e9:.4f}",
                f"{r['val_loss']:.4f}", "" if r["delta_vs_dense"] is None else f"{r['delta_vs_dense']:+.4f}",
                exits, _wall("compare", COMPARE_ROWS[method])]
        assert [layout, params, gflops, loss, delta, early, wall] == want, method


ABLATION_ROWS = {  # docs/evaluation.md's row -> (run, the row it is compared with)
    "1 dense": ("gpt2-small-20k", None),
    "2 recurrence alone (`h = core(h)`)": ("ablation-fig5-2-recurrence", "gpt2-small-20k"),
    "3 + prelude / coda": ("ablation-fig5-3-prelude-coda", "ablation-fig5-2-recurrence"),
    "4 + state noise (every step)": ("ablation-fig5-4-state-noise", "ablation-fig5-3-prelude-coda"),
    "4b + state noise at initialisation only": ("ablation-fig5-4b-noise-at-init", "ablation-fig5-3-prelude-coda"),
    "5 + prelude re-injection": ("ablation-fig5-5-reinjection", "ablation-fig5-4-state-noise"),
    "6 + gate (the full model, seed 1337)": ("recurrentgpt-small-isoflops-20k", "ablation-fig5-5-reinjection"),
    "6, seed 42": ("ablation-b1-seed42-recurrentgpt", None)}


def test_the_ablation_table_is_its_records(tmp_path):
    """make ablation (results/ablation): docs/evaluation.md's Fig. 5 rows at CPU scale, the loss at R of
    each row's run and its differences from the row before it and from the dense run."""
    rows = _rows_by_run("ablation", tmp_path)
    doc = _table_rows("evaluation.md", "| row | layout | val loss |")
    assert [row[0] for row in doc] == list(ABLATION_ROWS)
    dense = rows["gpt2-small-20k"]["val_loss"]
    for label, layout, loss, vs_previous, vs_dense in doc:
        run, previous = ABLATION_ROWS[label]
        r = rows[run]
        assert [layout, loss] == [r["layout"], f"{r['val_loss']:.4f}"], label
        want_previous = "" if previous is None else f"{r['val_loss'] - rows[previous]['val_loss']:+.4f}"
        assert vs_previous.split(" (")[0] == want_previous, label
        assert vs_dense == ("" if run == "gpt2-small-20k" else f"{r['val_loss'] - dense:+.4f}"), label


def _stands_for(shown: str, value: float, spread: float = 1e-6) -> bool:
    """A number as the docs show it stands for `value`: within half a unit of its last digit, plus
    `spread` of the value for the fit's own spread over float paths. L-BFGS-B stops at a tolerance:
    under numpy without AVX-512 and OpenBLAS's Sandy Bridge kernels the full-data fits' numbers moved
    by under 2e-8 of themselves (the default spread, 1e-6), the bootstrap intervals' ends by under
    4e-5 (INTERVAL_SPREAD)."""
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown) - value) <= 0.5 * 10 ** -decimals + spread * abs(value)


INTERVAL_SPREAD = 1e-4


def test_the_phi_fit_is_its_records(tmp_path):
    """make phi (results/phi): the law refitted from the 27 records by the study's own report gives
    docs/evaluation.md's table (each fit's phi, alpha, beta and E, the free fit's intervals, R^2), the
    loss ranges of the smallest and largest budgets, and the two Huber sums the text compares."""
    runs = study("phi").plan("cpu")
    _recorded("phi", runs)
    fit = json.loads(study("phi").report(Context(out=_restored("phi", tmp_path)), runs)["json"].read_text())
    assert len(fit["observations"]) == len(runs)
    doc = _table_rows("evaluation.md", "| fit | phi [95% CI] | alpha | beta | E | R^2 (log L) |")
    assert [row[0] for row in doc] == ["phi free", "phi = 0", "phi = 1"]
    for name, *cells, r2 in doc:
        law, intervals = fit["fits"][name], fit["intervals"].get(name, {})
        for cell, param in zip(cells, ("phi", "alpha", "beta", "E")):
            shown = re.findall(r"-?\d+(?:\.\d+)?", cell.split(" (")[0])
            want = [law[param], *intervals[param]] if len(shown) > 1 else [law[param]]
            spread = [1e-6, INTERVAL_SPREAD, INTERVAL_SPREAD][:len(want)]
            assert len(shown) == len(want) and all(map(_stands_for, shown, want, spread)), (name, param, cell)
        assert _stands_for(r2, fit["r2"][name]), (name, r2)
        assert law["E"] == pytest.approx(math.exp(-3), rel=1e-9)  # "the box's bound": e = log E at -3
    text = _flat(ROOT / "docs" / "evaluation.md")
    budgets = sorted({o["budget"] for o in fit["observations"]}, key=float)  # a cell label, "8.92e+11"
    for where, budget in (("smallest budget", budgets[0]), ("largest", budgets[-1])):
        lo, hi = re.search(rf"(\d\.\d+)-(\d\.\d+) at the {where}", text).groups()
        losses = [o["loss"] for o in fit["observations"] if o["budget"] == budget]
        assert _stands_for(lo, min(losses)) and _stands_for(hi, max(losses)), where
    free, one = re.search(r"the free fit is lower: ([\d.]+) against ([\d.]+)", text).groups()
    assert _stands_for(free, fit["fits"]["phi free"]["objective"])
    assert _stands_for(one, fit["fits"]["phi = 1"]["objective"])
    by_cell: dict[tuple[str, str], dict[str, float]] = {}   # (width, budget) -> r -> loss
    for o in fit["observations"]:
        r, width, budget = re.fullmatch(r"phi-cpu-r(\d)-d(\d+)-c(.+)", Path(o["run"]).name).groups()
        by_cell.setdefault((width, budget), {})[r] = o["loss"]
    spread = re.search(r"the three r differ by at most ([\d.]+) nats", text).group(1)
    assert _stands_for(spread, max(max(v.values()) - min(v.values()) for v in by_cell.values()))
    for budget in {b for _, b in by_cell}:   # "the narrowest model has the lowest loss, beats the widest at every r"
        assert min(by_cell["32", budget].values()) == min(x for (_, b), v in by_cell.items() if b == budget
                                                          for x in v.values())
        assert all(by_cell["32", budget][r] < by_cell["64", budget][r] for r in by_cell["32", budget])
    law, (lo, hi) = fit["fits"]["phi free"], fit["intervals"]["phi free"]["phi"]
    readme = _flat(ROOT / "README.md")
    assert f"phi {law['phi']:.3f} with a 95 % interval of [{lo:.2f}, {hi:.2f}]" in readme


def _analyses(name: str) -> dict[str, dict]:
    """results/<name>/: each NAME.json that an evaluation command wrote there."""
    return {p.stem: json.loads(p.read_text()) for p in (RESULTS / name).glob("*.json")}


APPENDIX_E = ["attention", "diagnostics", "difficulty", "effective_rank", "forced_gate", "frequency",
              "gate_attribution", "projection", "top_tokens", "update_dynamics"]


def test_the_quickstart_evaluation_is_its_outputs():
    """README.md's early-exit row, gate level and lm-eval range for the quickstart checkpoint are those
    of `make quickstart-eval`'s JSON files kept in results/quickstart-eval/."""
    q = _analyses("quickstart-eval")
    assert sorted(q) == sorted([*APPENDIX_E, "early_exit", "lm_eval_results"])  # E.4 needs a dense model
    readme = (ROOT / "README.md").read_text()
    losses = [row["loss"] for row in sorted(q["early_exit"], key=lambda row: row["depth"])]
    assert [row["depth"] for row in q["early_exit"]] == list(range(9))
    assert "| validation loss | " + " | ".join(f"{x:.4f}" for x in losses) + " |" in readme
    text = _flat(ROOT / "README.md")
    assert f"the curve spans {max(losses) - min(losses):.3f} nats" in text
    assert {f"{g:.2f}" for g in q["diagnostics"]["gate_mean"][1:]} == {"0.98"} and "gates stay near 0.98" in text
    acc = [run["tasks"]["rgpt_example"] for run in q["lm_eval_results"]["runs"]]
    assert all(a["acc"] == a["own_acc"] for a in acc)   # "lm-eval and our own scoring agreeing"
    assert f"gives {min(a['acc'] for a in acc):.3f}-{max(a['acc'] for a in acc):.3f} accuracy" in text


def test_the_appendix_e_figures_are_their_outputs():
    """docs/evaluation.md's Appendix E figures on the quickstart checkpoint and on make compare's
    RecurrentGPT are those of the analyses' JSON files kept in results/quickstart-eval/ and
    results/compare-diagnostics/."""
    text = _flat(ROOT / "docs" / "evaluation.md")
    q = _analyses("quickstart-eval")
    cfg = yaml.safe_load((RESULTS / "quickstart-eval" / "config.yaml").read_text())
    model = cfg["model"]
    layout = f"{model['n_pre']}+{model['n_rec']}x{model['n_loops']}+{model['n_coda']}"
    assert f"{cfg['train']['max_steps']} steps, {layout}, d = {model['d_model']}" in text
    fg, ud, dif, er = q["forced_gate"], q["update_dynamics"], q["difficulty"], q["effective_rank"]
    assert fg["loss_gate1"] == fg["loss_prelude"] and fg["r"] == 4
    shown = [f"gate = 1 gives {fg['loss_gate1']:.4f}, exactly the prelude-only loss; gate = 0 gives "
             f"{fg['loss_gate0']:.3f}; the trained gate {fg['loss'][4]:.4f} at r = 4 and {fg['loss'][8]:.4f} at r = 8",
             f"the proposal norm is flat ({ud['proposal_norm'][1]:.2f} to {ud['proposal_norm'][-1]:.2f}",
             f"the applied update halves ({ud['update_norm'][1]:.3f} to {ud['update_norm'][-1]:.3f}), cos(o, h) grows "
             f"from {ud['proposal_cos'][1]:.2f} to {ud['proposal_cos'][-1]:.2f}",
             f"(R^2 = {dif['r2']:.2f}; paper 0.998)",
             f"clearly negative, {min(dif['gate_corr'][1:]):.3f} to {max(dif['gate_corr'][1:]):.3f}",
             f"grows {er['state_rank'][0]:.3f} to {er['state_rank'][-1]:.3f}, the late-update subspace has "
             f"{er['delta_rank']:.3f}, above it"]
    steps, ratio = q["gate_attribution"]["steps"], q["gate_attribution"]["leading_ratio"]
    shown.append(f"stays near half ({100 * steps[0]['share_state']:.1f}% to {100 * steps[-1]['share_state']:.1f}%")
    shown.append(f"the leading singular values of W_x and W_h differ by {100 * (ratio - 1):.0f}%")
    shown.append(f"aligned (mean row cosine {q['projection']['cosine_mean']:+.2f})")
    attention = q["attention"]
    assert attention["class_counts"] == {"local/sharp": 0, "previous-token": 0, "self": 0, "broadcast": 0, "general": 4}
    assert {f"{e:.2f}" for e in attention["mean_entropy"]} == {"3.75"}
    shown.append("E.9: 4 core heads, all general, entropy 3.75 nats at every step")
    assert all(abs(band["recovery"]) < 0.005 for band in q["frequency"]["bands"])
    shown.append("E.10: recovery under 0.5% in every band")
    c = _analyses("compare-diagnostics")
    assert sorted(c) == sorted([*APPENDIX_E, "dense_cka"])
    cka, cfg = c["dense_cka"], c["forced_gate"]
    run = yaml.safe_load((RESULTS / "compare" / COMPARE_ROWS["RecurrentGPT (seed 1337)"] / "config.yaml").read_text())
    assert f"(1+1x{run['model']['n_loops']}+1, {run['train']['max_steps']} steps, the run of `results/compare/`" in text
    assert set(cka["best_layer"]) == {3} and len(cka["best_layer"]) == cfg["r"] + 1 == 11   # steps 0..10
    assert cfg["loss_gate1"] < cfg["loss"][cfg["r"]]
    shown += [f"the fixed-point delta is {c['effective_rank']['fixed_point_delta'][1]:.3f} at the first step",
              f"gate = 1 ({cfg['loss_gate1']:.4f}) is below the trained gate ({cfg['loss'][cfg['r']]:.4f})",
              f"matches dense layer 3 best (CKA {min(cka['best_cka']):.3f}-{max(cka['best_cka']):.3f})"]
    for claim in shown:
        assert claim in text, claim
