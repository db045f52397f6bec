"""Evaluate a checkpoint or an export: early-exit curve, Appendix E diagnostics, lm-evaluation-harness.

    rgpt-eval curve runs/quickstart --out eval/quickstart                 # loss at R* = 0..2R, FLOPs, plots
    rgpt-eval curve exports/x --depths 0,1,2,4,8 --data data/python-stdlib --batches 20 --out eval/x
    rgpt-eval curve exports/ouro --exit-thresholds 0.3,0.5,0.9 --out eval/ouro   # + per-token exits (Ouro)
    rgpt-eval diagnostics runs/quickstart --out eval/quickstart           # per-step KL, gates, CKA, heatmap
    rgpt-eval diagnostics exports/x --all --dense exports/gpt2 --out eval/x  # all of Appendix E + report.html
    rgpt-eval lm-eval exports/x --tasks rgpt_example --depths 1,4,8 --out eval/x   # accuracy vs R*
    rgpt-eval lm-eval exports/x --tasks hellaswag,arc_easy --out eval/x   # standard tasks (downloads data)
    rgpt-eval grid runs --out results                                     # Table 1 layout over a runs dir
    rgpt-eval phi runs/phi-rgpt-* --out results/phi-rgpt                  # the looped scaling law's phi
    rgpt-eval phi runs --study trunc --out results/phi-trunc                # a case study against its baseline
    rgpt-eval phi --group 'a=runs/x-*' --group 'b=runs/y-*,runs/z-*' --out results/ab   # any two groups

SOURCE is an rgpt-export directory or a training checkpoint (run dir, checkpoints/ or step_*); the
validation data defaults to the run's own (`data.paths`, `data.val_split`). lm-eval needs an export
(it loads OUT/hf); for the bundled tasks it also scores the items itself and reports both
(`own_acc`, `own_acc_norm` columns must equal lm-eval's). Exit status 2 on unusable input.

--out is a directory that the commands add to (curve, diagnostics and lm-eval may share one). It must
be a real directory or absent: a file, a dangling symbolic link or a link to a directory is refused.
Each command writes into a private staging directory inside OUT (`.rgpt-eval-partial-XXXXXXXX`; an
interrupted run's one is removed by the next run) and then renames its files into OUT; a symbolic link
(or a non-file) at the name of an output is refused, naming it, before any file is moved, so nothing is
ever written through a link planted in OUT (docs/security.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

from launcher.arg_types import BOOTSTRAP_ARG, RESTARTS_ARG, count
from rgpt_dist.checkpoints.consolidate import ExportError
from rgpt_dist.checkpoints.source import load_model
from rgpt_dist.data.tokenizer import get_encoding
from rgpt_dist.eval.appendix import analysis
from rgpt_dist.eval.appendix.common import Context
from rgpt_dist.eval.appendix.diagnostics import diagnose, gate_heatmap
from rgpt_dist.eval.appendix.report import run_all, write_report
from rgpt_dist.eval.early_exit import MAX_DEPTH_FACTOR, early_exit_curve, val_batches, write_curve
from rgpt_dist.eval.phi.fit import MAX_SAMPLES, MAX_STARTS
from rgpt_dist.eval.grid import summarize, write_table
from rgpt_dist.eval.harness import BUNDLED_TASK_DATA, depth_sweep, run_lm_eval, write_results
from rgpt_dist.eval.learned_exit import threshold_exit_rows, write_threshold_exits
from rgpt_dist.eval.phi.analysis import analyse, groups_of
from rgpt_dist.eval.scoring import own_accuracy
from rgpt_dist.models.config import MAX_BLOCKS
from rgpt_dist.models.spec import spec_for
from rgpt_dist.safe_paths import MARKER, out_dir, publish, staging
from rgpt_dist.studies.ablation.table import markdown as ablation_markdown
from rgpt_dist.studies.phi.grid import study_groups

STAGING = ".rgpt-eval-partial-"


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]




CKA_BYTES = 4 * 2**30
"""diagnostics --r: the CKA statistics hold (r + 1)(r + 2) / 2 matrices of d_model^2 doubles
(rgpt_dist.eval.appendix.diagnostics.CKAStats) and a forward keeps r + 1 states: r is at most 16 x the
trained depth R (as curve's --depths) and at most what keeps those matrices within 4 GiB."""

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rgpt-eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("curve", "validation loss vs depth and FLOPs"), ("diagnostics", "Appendix E diagnostics")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("source", help="export directory or training checkpoint")
        s.add_argument("--out", required=True, help="output directory (CSV, JSON, PNG)")
        s.add_argument("--data", nargs="+", help="rgpt-prep dataset(s) (default: the run's data.paths)")
        s.add_argument("--split", help="split to evaluate (default: the run's data.val_split)")
        s.add_argument("--batch-size", type=count(), default=8)
        s.add_argument("--batches", type=count(), default=20, help="number of batches (file order)")
        s.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (cuda when available)")
        s.add_argument("--trust-checkpoint", action="store_true",
                       help="UNSAFE: load checkpoint files that need full unpickling (runs code the file names)")
    sub.choices["curve"].add_argument("--depths", type=_ints, help="comma-separated R* values (default 0..2R; at most 16 x R)")
    sub.choices["curve"].add_argument("--exit-thresholds", type=_floats,
                                      help="families with a learned exit (Ouro): comma-separated thresholds q of the "
                                           "per-token exit (default: the model's exit_threshold)")
    d = sub.choices["diagnostics"]
    d.add_argument("--r", type=count(MAX_DEPTH_FACTOR * MAX_BLOCKS, f"{MAX_DEPTH_FACTOR} x the deepest trained depth "
                                      f"R, {MAX_BLOCKS}; the model's own bound is checked once it is loaded"),
                   help=f"depth to diagnose (default R; at most {MAX_DEPTH_FACTOR} x R)")
    d.add_argument("--all", action="store_true",
                   help="every Appendix E analysis (rgpt_dist.eval.appendix) and report.md / report.html")
    d.add_argument("--only", help="with --all: comma-separated analyses to run (default: all)")
    d.add_argument("--dense", help="with --all: a dense GPT-2 export or checkpoint for E.4's cross-model CKA")
    d.add_argument("--prompt", help="with --all: text of the prompt for Fig. 4 and the gate heatmap "
                                    "(default: the first validation sequence)")
    s = sub.add_parser("lm-eval", help="lm-evaluation-harness on OUT/hf, optionally over depths")
    s.add_argument("export", help="rgpt-export directory (or its hf/ directory)")
    s.add_argument("--out", required=True)
    s.add_argument("--tasks", default="rgpt_example", help="comma-separated lm-eval tasks (default: the bundled example)")
    s.add_argument("--depths", type=_ints, help="RecurrentGPT: comma-separated R* values to sweep")
    s.add_argument("--include-path", help="extra directory of lm-eval task YAMLs")
    s.add_argument("--limit", type=count(), help="items per task (smoke runs)")
    s.add_argument("--batch-size", type=count(), default=1, help="1 reproduces our own scoring bitwise")
    s.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (cuda when available)")
    s.add_argument("--remote-code", choices=["auto", "never", "trust"], default="auto",
                   help="run the export's shipped model code: auto (only when it is byte-identical to this "
                        "checkout's; none for dense GPT-2), never, or trust (UNSAFE) (default auto)")
    s = sub.add_parser("grid", help="final loss, parameters, FLOPs and early-exit curve of every run (Table 1)")
    s.add_argument("runs_dir", help="directory holding run directories (runs/<model>-<budget>)")
    s.add_argument("--out", required=True)
    s = sub.add_parser("phi", help="fit L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta over runs (issue #26)")
    s.add_argument("runs", nargs="*", help="run directories, or directories of runs")
    s.add_argument("--group", action="append", default=[], metavar="NAME=PATTERN[,PATTERN...]",
                   help="fit each named group of runs (glob patterns, quoted) and compare their phi; repeatable")
    s.add_argument("--study", default=None, metavar="NAME",
                   help="a case study of the sweep (trunc, nogate) against its baseline at its budgets; RUNS is "
                        "the sweep's runs directory")
    s.add_argument("--restarts", type=RESTARTS_ARG, default=500,
                   help=f"L-BFGS-B starts per fit (default 500, at most {MAX_STARTS:,})")
    s.add_argument("--bootstrap", type=BOOTSTRAP_ARG, default=200,
                   help=f"block-bootstrap resamples (default 200, at most {MAX_SAMPLES:,})")
    s.add_argument("--seed", type=int, default=0, help="seed of the starts and the resampling (default 0)")
    s.add_argument("--out", required=True)
    return p


def _device(name: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def _model_and_batches(args, check=None):
    """The model (on --device) and the validation batches (there too); check(model), if given, runs
    before any batch is read."""

    model, record = load_model(args.source, trust=args.trust_checkpoint)
    if check is not None:
        check(model)
    device = _device(args.device)
    data = record.get("data", {})
    paths = args.data or data.get("paths")
    if not paths:
        raise ValueError("no validation data: pass --data (the export records none)")
    batches = val_batches(paths, args.split or data.get("val_split", "val"), args.batch_size, args.batches,
                          vocab_size=model.cfg.vocab_size)
    return model.to(device), [(x.to(device), y.to(device)) for x, y in batches], record


def curve(args, out: Path) -> None:
    model, batches, record = _model_and_batches(args)
    learned_exit = spec_for(model.cfg).learned_exit
    if args.exit_thresholds and not learned_exit:
        raise ValueError(f"{args.source} is a {model.cfg.family} model: --exit-thresholds needs a learned exit (Ouro)")
    rows = early_exit_curve(model, batches, args.depths)
    write_curve(rows, out, f"{args.source} (step {record.get('step')})")
    for row in rows:
        print(f"R*={row['depth']}  loss {row['loss']:.4f}  GFLOPs/token {row['flops_per_token'] / 1e9:.4f}"
              + (f"  ({row['problem']})" if row["problem"] else ""))
    if learned_exit:

        exits = threshold_exit_rows(model, batches, args.exit_thresholds or [model.cfg.exit_threshold])
        write_threshold_exits(exits, out)
        for row in exits:
            print(f"exit q={row['threshold']}  loss {row['loss']:.4f}  mean depth {row['mean_depth']:.2f}  "
                  f"GFLOPs/token {row['flops_per_token'] / 1e9:.4f} ({row['flops_vs_depth_R']:.3f} of depth R)")


def diagnostics(args, out: Path) -> None:
    if not args.all and (args.only or args.dense or args.prompt is not None):
        raise ValueError("--only, --dense and --prompt go with --all")
    for name in filter(None, (args.only or "").split(",")):   # unknown names refused before loading anything
        analysis(name)
    model, batches, _ = _model_and_batches(args, check=lambda m: _check_depth(args, m.cfg))
    if not spec_for(model.cfg).diagnostics:
        raise ValueError(f"{args.source} is a {model.cfg.family} model: the diagnostics are RecurrentGPT's "
                         "per-step gate and state statistics")
    if getattr(model.cfg, "gate", "learned") != "learned":
        raise ValueError(f"{args.source} was trained without the gate (model.gate={model.cfg.gate}): the "
                         "diagnostics read the gate's statistics")
    if args.all:
        return _appendix(args, model, batches, out)
    result = diagnose(model, batches, r=args.r)
    result.to_json(out / "diagnostics.json")
    result.write_csv(out / "diagnostics.csv")
    result.plot(out)
    gate_heatmap(model, batches[0][0][:1, :64], out / "gate_heatmap.png", decode=get_encoding().decode, r=args.r)
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir() if p.name != MARKER))} to {args.out}")


def _check_depth(args, cfg) -> None:
    """diagnostics --r within 16 x R and the CKA statistics' CKA_BYTES (ValueError naming both bounds)."""
    if args.r is None or not spec_for(cfg).diagnostics:  # a model without the diagnostics is refused by name after
        return
    pairs = CKA_BYTES // (8 * cfg.d_model ** 2)                       # (r + 1)(r + 2) / 2 matrices at most
    by_cka, by_depth = (math.isqrt(8 * pairs + 1) - 1) // 2 - 1, MAX_DEPTH_FACTOR * cfg.n_loops
    if args.r > min(by_cka, by_depth):
        raise ValueError(f"--r {args.r} is out of range for {args.source}: at most {min(by_cka, by_depth)} "
                         f"({MAX_DEPTH_FACTOR} x the trained depth R = {cfg.n_loops} is {by_depth}; the CKA statistics, "
                         f"(r + 1)(r + 2) / 2 matrices of d_model^2 = {cfg.d_model}^2 doubles, stay within "
                         f"{CKA_BYTES // 2**30} GiB up to r = {by_cka})")


def _appendix(args, model, batches, out: Path) -> None:
    """`diagnostics --all`: every Appendix E analysis, each with its JSON, CSV and plot, and the report."""

    enc = get_encoding()
    dense = None
    if args.dense:
        dense, _ = load_model(args.dense, trust=args.trust_checkpoint)
        if spec_for(dense.cfg).recurrent:
            raise ValueError(f"--dense {args.dense} is a {dense.cfg.family} model, not a dense GPT-2")
        dense = dense.to(batches[0][0].device).eval()
    prompt = None
    if args.prompt is not None:
        ids = enc.encode_ordinary(args.prompt)[-model.cfg.block_size:]   # its last block_size tokens
        if not ids:
            raise ValueError("--prompt is empty")
        prompt = torch.tensor(ids, device=batches[0][0].device)
    ctx = Context(model=model.eval(), batches=batches, out=out, r=args.r, dense=dense, prompt=prompt,
                  decode=enc.decode)
    names = [n for n in args.only.split(",") if n] if args.only else None
    results, skipped = run_all(ctx, names)
    header = (f"Source: `{args.source}`, depth r = {ctx.depth}, {sum(int(x.numel()) for x, _ in batches)} "
              f"validation tokens ({len(batches)} batches)" + (f", dense: `{args.dense}`" if args.dense else "") + ".")
    write_report(results, out, header, skipped)
    for line in skipped:
        print(line)
    print(f"wrote {len(results)} analyses and report.md / report.html to {args.out}")


def lm_eval(args, out: Path) -> None:
    hf_dir = Path(args.export)
    if (hf_dir / "hf").is_symlink():  # the remote-code check lists the export it was given, not a link's target
        raise ValueError(f"{hf_dir / 'hf'} is a symbolic link: refusing to load an export through it")
    hf_dir = hf_dir / "hf" if (hf_dir / "hf" / "config.json").is_file() else hf_dir
    tasks = [t for t in args.tasks.split(",") if t]
    common = dict(include_path=args.include_path, limit=args.limit, batch_size=args.batch_size,
                  device=_device(args.device), remote_code=args.remote_code)
    if args.depths:
        runs = depth_sweep(hf_dir, tasks, args.depths, **common)
    else:
        runs = [run_lm_eval(hf_dir, tasks, **common)]
    for run in runs:
        _own_scores(hf_dir, run, args.limit, common["device"], args.remote_code)
    written = write_results(runs, out)
    for run in runs:
        for task, m in run["tasks"].items():
            own = f" (own {m['own_acc']:.4f})" if "own_acc" in m else ""
            print(f"R*={run.get('r_eval')}  {task}: acc {m.get('acc', float('nan')):.4f}{own}  n={m.get('n')}")
    final = Path(args.out)
    print(json.dumps({k: [str(final / p.name) for p in v] if isinstance(v, list) else str(final / v.name)
                      for k, v in written.items()}))


def _own_scores(hf_dir: Path, run: dict, limit: int | None, device: str, remote_code: str) -> None:
    """Our own multiple-choice scoring of the bundled tasks beside lm-eval's, at the run's depth."""

    extra = {} if run.get("r_eval") is None else {"r_eval": run["r_eval"]}
    for task, metrics in run["tasks"].items():
        if task in BUNDLED_TASK_DATA:
            own = own_accuracy(hf_dir, BUNDLED_TASK_DATA[task], model_args_extra=extra, limit=limit, device=device,
                               remote_code=remote_code)
            metrics.update(own_acc=own["acc"], own_acc_norm=own["acc_norm"])


def grid(args, out: Path) -> None:
    rows = summarize(args.runs_dir)
    paths = write_table(rows, out)
    ablations = ablation_markdown(rows)  # the ablation runs among them: their own tables
    if ablations is not None:
        (out / "ablations.md").write_text(ablations)
        paths.append(out / "ablations.md")
    print((out / "grid.md").read_text())
    print(f"wrote {', '.join(str(Path(args.out) / p.name) for p in paths)}")


def phi(args, out: Path) -> None:
    groups = study_groups(args.runs, args.group, args.study) if args.study else groups_of(args.runs, args.group)
    summary = analyse(groups, out, restarts=args.restarts, samples=args.bootstrap, seed=args.seed)
    print(summary)


def _run_into(command, args) -> None:
    """Runs `command` with a staging directory inside OUT, then moves what it wrote into OUT (module doc).
    A command that fails leaves no trace: the directories made for OUT are removed again (if empty)."""
    out = out_dir(args.out)
    made = [p for p in (out, *out.parents) if not os.path.lexists(p)]  # deepest first
    out.mkdir(parents=True, exist_ok=True)
    try:
        out = out_dir(args.out)  # again: whatever stands at OUT now, not what stood there before mkdir
        with staging(out, STAGING) as tmp:
            command(args, tmp)
            publish(tmp, out)
    except BaseException:
        for p in made:
            try:
                os.rmdir(p)
            except OSError:
                break
        raise


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    try:
        _run_into({"curve": curve, "diagnostics": diagnostics, "lm-eval": lm_eval, "grid": grid, "phi": phi}[args.command],
                  args)
    except (ExportError, ValueError, FileNotFoundError) as e:
        print(f"rgpt-eval: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
