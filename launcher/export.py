"""Export a training checkpoint (any ZeRO stage, any tensor-parallel size) for evaluation and sharing.

    rgpt-export runs/quickstart exports/quickstart                  # newest complete checkpoint of a run
    rgpt-export runs/x/checkpoints/step_00020000 exports/x --dtype bf16 --overwrite
    rgpt-export runs/x exports/x --r-eval 8 --kv-strategy average   # RecurrentGPT inference defaults

Writes OUT/native (model.safetensors + config.json), OUT/hf (Hugging Face directory with tokenizer;
RecurrentGPT loads with trust_remote_code=True) and OUT/export.json. Exit status 2 when the checkpoint
cannot be exported (incomplete, corrupted, not ours, or a file that would run code on loading), when
OUT exists without --overwrite, and when OUT cannot be used: a file or a symbolic link, the run being
exported (or inside it, or above it), or, with --overwrite, a non-empty directory that is not a
previous export (docs/security.md). Checkpoint files are read without running code unless
--trust-checkpoint is given (UNSAFE: only for checkpoints you trust; docs/security.md).
"""
from __future__ import annotations

import argparse
import sys

from rgpt_dist.checkpoints.consolidate import ExportError
from rgpt_dist.export.exporter import DTYPES, export


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rgpt-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a run directory, its checkpoints/ directory, or one step_* directory")
    p.add_argument("out", help="export directory to create")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="weights dtype (default fp32)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a previous export at OUT (only an rgpt-export directory or an empty one)")
    p.add_argument("--r-eval", type=int, help="RecurrentGPT: recurrence depth R* the HF model runs (default R)")
    p.add_argument("--kv-strategy", choices=["full", "first", "last", "average"],
                   help="RecurrentGPT: KV-cache strategy of the HF model (default full)")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="UNSAFE: load checkpoint files that need full unpickling (runs code the file names)")
    args = p.parse_args(argv)
    inference = {k: v for k, v in (("r_eval", args.r_eval), ("kv_strategy", args.kv_strategy)) if v is not None}
    try:
        export(args.checkpoint, args.out, overwrite=args.overwrite, dtype=args.dtype, inference=inference,
               trust=args.trust_checkpoint)
    except (ExportError, ValueError) as e:
        print(f"rgpt-export: {e}", file=sys.stderr)
        return 2
    print(f"exported to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
