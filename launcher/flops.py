"""Parameter and FLOPs calculator for named flavours or config files.

    rgpt-flops                                   # every flavour, paper Table 1 columns beside ours
    rgpt-flops recurrentgpt-medium-isoflops gpt2-medium --seq-len 1024 --json
    rgpt-flops configs/models/recurrentgpt-debug.yaml --set model.n_loops=8
    rgpt-flops --solve n_loops --dense gpt2-medium --n-pre 2 --n-coda 2 --n-rec 5
    rgpt-flops --solve n_rec --dense gpt2-large --n-pre 1 --n-coda 5 --n-loops 6
"""
from __future__ import annotations

import argparse
import json
import sys

from rgpt_dist.config import DENSE_REFERENCE, FLAVOURS, ConfigError, GPT2Config, load_config
from rgpt_dist.flops import report, solve_isoflops

_COLUMNS = [("name", "{}"), ("layout", "{}"), ("params", "{:,.0f}"), ("params_no_embedding", "{:,.0f}"),
            ("unique_blocks", "{}"), ("block_executions", "{}"), ("fwd_flops_per_token", "{:.4g}"),
            ("head_flops_per_token", "{:.4g}"), ("expected_r", "{}"), ("train_flops_per_token", "{:.4g}"),
            ("fwd_ratio_to_dense", "{:.3f}"), ("paper_params", "{:.3g}"), ("paper_flops_fwd", "{:.3g}"),
            ("paper_fwd_ratio_to_dense", "{:.3f}")]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rgpt-flops", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", help="flavour names or YAML files (default: every flavour)")
    p.add_argument("--seq-len", type=int, default=1024, help="sequence length S of Eq. 1 (default 1024)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every target (with --solve: for the dense model)")
    p.add_argument("--dense", default=None, help="dense reference flavour (default: the paper's pairing)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--solve", choices=["n_loops", "n_rec"], help="find the isoFLOPs R (n_loops) or n_rec")
    p.add_argument("--n-pre", type=int, default=1, help="prelude blocks for --solve")
    p.add_argument("--n-coda", type=int, default=1, help="coda blocks for --solve")
    p.add_argument("--n-rec", type=int, help="shared blocks for --solve n_loops")
    p.add_argument("--n-loops", type=int, help="recurrence depth R for --solve n_rec")
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.solve:
            dense = load_config(args.dense or "gpt2-medium", args.set).model
            if not isinstance(dense, GPT2Config):
                raise ConfigError(f"--dense {args.dense!r} is not a dense gpt2 model")
            out = solve_isoflops(dense, args.n_pre, args.n_coda, args.seq_len, n_rec=args.n_rec, n_loops=args.n_loops)
            print(json.dumps(out, indent=2) if args.json else
                  f"{args.solve}: exact {out['exact']:.3f}, block-matched {out['block_matched']:.3f}\n" +
                  "\n".join(f"  {args.solve}={c['value']}: forward FLOPs ratio to dense {c['ratio']:.4f}"
                            for c in out["candidates"]))
            return 0
        rows = []
        for target in args.targets or list(FLAVOURS):
            cfg = load_config(target, args.set).model
            dense_name = args.dense or DENSE_REFERENCE.get(target)
            dense = load_config(dense_name).model if dense_name else None  # overrides are for targets
            rows.append(report(str(target), cfg, args.seq_len, dense))
    except (ConfigError, ValueError) as e:
        print(f"rgpt-flops: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if args.json else _table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
