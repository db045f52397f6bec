"""Parameter and FLOPs calculator for named flavours or config files.

    rgpt-flops                                   # every flavour, paper Table 1 columns beside ours
    rgpt-flops recurrentgpt-medium-isoflops gpt2-medium --seq-len 1024 --json
    rgpt-flops configs/models/recurrentgpt-debug.yaml --set model.n_loops=8
    rgpt-flops --solve n_loops --dense gpt2-medium --n-pre 2 --n-coda 2 --n-rec 5
    rgpt-flops --solve n_rec --dense gpt2-large --n-pre 1 --n-coda 5 --n-loops 6
    rgpt-flops --budget 20k,40k --gpu-peak 989e12 --mfu 0.4  # training FLOPs, GPU-hours, 8-GPU node hours
    rgpt-flops --grid --budget 20k,40k                     # every run of the paper's grid, and its totals

params_once / params_rec: the non-embedding split of the looped scaling law (N_once, N_rec; SPEC
section 10, rgpt_dist.flops.param_split), in the table and in --json.
With --budget each target gets one row per budget: total training FLOPs (3 x Eq. 1 forward at E[r],
head included, x tokens/step x steps), GPU-hours at the assumed peak and MFU, and hours on one node
of --gpus-per-node GPUs (perfect scaling; evaluation, checkpoints and restarts not included).
--grid takes every model Table 1 trains (the runs of configs/experiments/, each dense baseline once)
and, with --budget, the compute-matched runs on their own steps (<cell>-flopmatched: MoR at its
dense model's training FLOPs), and ends with the whole grid's GPU-hours per budget.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from rgpt_dist.config import DENSE_REFERENCE, FLAVOURS, ConfigError, load_config
from rgpt_dist.studies.compare.grid import (BUDGETS, FLOP_MATCHED, flop_matched_cells, flop_matched_steps,
                                          trained_flavours)
from rgpt_dist.flops import gpu_hours, report, solve_isoflops, total_train_flops
from rgpt_dist.models.spec import spec_for

_COLUMNS = [("name", "{}"), ("layout", "{}"), ("params", "{:,.0f}"), ("params_no_embedding", "{:,.0f}"),
            ("params_once", "{:,.0f}"), ("params_rec", "{:,.0f}"), ("unique_blocks", "{}"),
            ("block_executions", "{}"), ("fwd_flops_per_token", "{:.4g}"),
            ("head_flops_per_token", "{:.4g}"), ("expected_r", "{}"), ("train_flops_per_token", "{:.4g}"),
            ("fwd_ratio_to_dense", "{:.3f}"), ("train_ratio_to_dense", "{:.3f}"), ("paper_params", "{:.3g}"),
            ("paper_flops_fwd", "{:.3g}"),
            ("paper_fwd_ratio_to_dense", "{:.3f}")]
_COST_COLUMNS = [("name", "{}"), ("layout", "{}"), ("params", "{:,.0f}"), ("expected_r", "{}"),
                 ("train_flops_per_token", "{:.4g}"), ("budget", "{}"), ("steps", "{:,}"), ("tokens", "{:.4g}"),
                 ("train_flops_total", "{:.3e}"), ("gpu_hours", "{:,.1f}"), ("node_hours", "{:,.1f}")]


def _budget(text: str) -> list[tuple[str, int]]:
    """--budget: comma-separated 20k, 40k (the grid's budgets), Nk or a plain step count."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        steps = BUDGETS.get(item)
        if steps is None:
            digits = item[:-1] if item.lower().endswith("k") else item
            if not digits.isdigit() or int(digits) <= 0:
                raise argparse.ArgumentTypeError(f"{item!r} is not 20k, 40k, Nk or a positive step count")
            steps = int(digits) * (1000 if digits != item else 1)
        out.append((item, steps))
    return out


def _number(kind, low, above: bool = False):
    """An argparse type: `kind(text)`, finite and >= low (> low when `above`): a zero or negative
    size divides by zero or reports negative FLOPs, inf or nan prints nonsense; argparse exits 2
    with the argument and value named."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} must be a finite number")
        if value < low or (above and value == low):
            raise argparse.ArgumentTypeError(f"{text} must be {'>' if above else '>='} {low}")
        return value
    return parse


def _positive(kind):
    return _number(kind, 0, above=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rgpt-flops", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", help="flavour names or YAML files (default: every flavour)")
    p.add_argument("--seq-len", type=_positive(int), default=1024, help="sequence length S of Eq. 1 (default 1024)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every target (with --solve: for the dense model)")
    p.add_argument("--dense", default=None, help="dense reference flavour (default: the paper's pairing)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--solve", choices=["n_loops", "n_rec"], help="find the isoFLOPs R (n_loops) or n_rec")
    p.add_argument("--n-pre", type=_number(int, 0), default=1, help="prelude blocks for --solve")
    p.add_argument("--n-coda", type=_number(int, 0), default=1, help="coda blocks for --solve")
    p.add_argument("--n-rec", type=_positive(int), help="shared blocks for --solve n_loops")
    p.add_argument("--n-loops", type=_positive(int), help="recurrence depth R for --solve n_rec")
    p.add_argument("--grid", action="store_true",
                   help="every model the paper's grid trains (instead of targets); with --budget, its totals")
    p.add_argument("--budget", type=_budget, metavar="20k|40k|N[,...]",
                   help="training steps (comma-separated for several): adds total training FLOPs and GPU-hours")
    p.add_argument("--tokens-per-step", type=_positive(int),
                   help="tokens per optimizer step (default: the target's train.global_batch_size x --seq-len)")
    p.add_argument("--gpu-peak", type=_positive(float), default=989e12,
                   help="peak FLOP/s of one GPU (default 989e12: H100/H200 dense bf16)")
    p.add_argument("--mfu", type=_positive(float), default=0.4,
                   help="assumed model FLOPs utilisation, 0 < MFU <= 1 (default 0.4)")
    p.add_argument("--gpus-per-node", type=_positive(int), default=8, help="GPUs per node for node_hours (default 8)")
    return p


def _table(rows: list[dict]) -> str:
    cells = [[c for c, _ in _COLUMNS]]
    for row in rows:
        cells.append([fmt.format(row[c]) if row.get(c) is not None else "-" for c, fmt in _COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    for row in rows:
        lines += [f"! {row['name']}: {flag}" for flag in row["flags"]]
    return "\n".join(lines)


def _cost_table(rows: list[dict], args: argparse.Namespace) -> str:
    cells = [[c for c, _ in _COST_COLUMNS]]
    for row in rows:
        cells.append([fmt.format(row[c]) if row.get(c) is not None else "-" for c, fmt in _COST_COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COST_COLUMNS))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    lines.append(f"assumed: peak {args.gpu_peak / 1e12:g} TFLOP/s per GPU, MFU {args.mfu:.0%} (an assumption, not a "
                 f"measurement), node_hours = gpu_hours / {args.gpus_per_node} GPUs (perfect scaling); "
                 f"evaluation, checkpoints, start-up and restarts not included")
    if args.grid:
        for budget, _ in args.budget:
            runs = [row for row in rows if row["budget"] == budget]
            lines.append(f"whole grid at {budget}: {len(runs)} runs, {sum(r['gpu_hours'] for r in runs):,.0f} GPU-hours, "
                         f"{sum(r['train_flops_total'] for r in runs):.3e} training FLOPs")
    return "\n".join(lines)


def _costs(row: dict, cfg, tokens_per_step: int, args: argparse.Namespace, steps_of=lambda steps: steps) -> list[dict]:
    """One row per budget: the report row plus the run's totals (`steps_of`: the run's steps at a
    budget's, for a FLOP-matched run)."""
    out = []
    for budget, budget_steps in args.budget:
        steps = steps_of(budget_steps)
        hours = gpu_hours(cfg, args.seq_len, steps, tokens_per_step, args.gpu_peak, args.mfu)
        out.append({**row, "budget": budget, "steps": steps, "tokens_per_step": tokens_per_step,
                    "tokens": steps * tokens_per_step,
                    "train_flops_total": total_train_flops(cfg, args.seq_len, steps, tokens_per_step),
                    "gpu_peak": args.gpu_peak, "mfu": args.mfu, "gpu_hours": hours,
                    "gpus_per_node": args.gpus_per_node, "node_hours": hours / args.gpus_per_node})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.mfu > 1:
        parser.error(f"--mfu {args.mfu} must be <= 1")
    if args.solve and args.budget:
        parser.error("--budget does not apply to --solve")
    if args.grid and (args.targets or args.solve):
        parser.error("--grid replaces the targets (and does not apply to --solve)")
    try:
        if args.solve:
            dense = load_config(args.dense or "gpt2-medium", args.set).model
            if spec_for(dense).recurrent:
                raise ConfigError(f"--dense {args.dense!r} is not a dense model (family {dense.family})")
            out = solve_isoflops(dense, args.n_pre, args.n_coda, args.seq_len, n_rec=args.n_rec, n_loops=args.n_loops)
            print(json.dumps(out, indent=2) if args.json else
                  f"{args.solve}: exact {out['exact']:.3f}, block-matched {out['block_matched']:.3f}\n" +
                  "\n".join(f"  {args.solve}={c['value']}: forward FLOPs ratio to dense {c['ratio']:.4f}"
                            for c in out["candidates"]))
            return 0
        rows = []
        if args.grid and args.budget:  # the compute-matched runs of the grid, on their own steps
            for cell in flop_matched_cells():
                full = load_config(cell, args.set)
                row = report(f"{cell}-{FLOP_MATCHED}", full.model, args.seq_len, load_config(DENSE_REFERENCE[cell]).model)
                rows += _costs(row, full.model, args.tokens_per_step or full.train.global_batch_size * args.seq_len,
                               args, lambda steps, cell=cell: flop_matched_steps(cell, steps))
        for target in trained_flavours() if args.grid else args.targets or list(FLAVOURS):
            full = load_config(target, args.set)
            cfg = full.model
            dense_name = args.dense or DENSE_REFERENCE.get(target)
            dense = load_config(dense_name).model if dense_name else None  # overrides are for targets
            row = report(str(target), cfg, args.seq_len, dense)
            if args.budget:
                rows += _costs(row, cfg, args.tokens_per_step or full.train.global_batch_size * args.seq_len, args)
            else:
                rows.append(row)
    except (ConfigError, ValueError) as e:
        print(f"rgpt-flops: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if args.json else _cost_table(rows, args) if args.budget else _table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
