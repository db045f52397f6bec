"""Train a model from an experiment config plus key=value overrides.

    torchrun --nproc_per_node 2 launcher/train.py configs/experiments/quickstart.yaml
    deepspeed --num_gpus 8 launcher/train.py configs/experiments/recurrentgpt-medium-isoflops-20k.yaml train.seed=42

The whole config is validated, and world-size and filesystem checks run (nothing the run will write
in its run directory may be a link or a FIFO: rgpt_dist/train/run_dir.py), before any process group,
model or data loader exists; a bad config exits with status 2 and one message per problem (printed
by rank 0 only). On SIGUSR1 or SIGTERM every rank finishes its step, the step is saved, and the
process exits with status 75 (under SLURM the job is requeued first; see docs/cluster.md).
"""
from __future__ import annotations

import os
import sys

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.durable import UnsafePath
from rgpt_dist.train.preflight import preflight
from rgpt_dist.train.run import train
from rgpt_dist.train.run_dir import unsafe_entries
from rgpt_dist.train.run_lock import RunDirBusy, lock_run_dir


def main(argv: list[str] | None = None) -> int:
    args = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("--local_rank")]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    try:
        cfg = load_config(args[0], args[1:])
        problems = preflight(cfg, int(os.environ.get("WORLD_SIZE", 1)))
        problems += unsafe_entries(cfg.log.run_dir, cfg.checkpoint.dir)  # planted links, FIFOs
        if problems:
            raise ConfigError(problems)
    except ConfigError as e:
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"train: {e}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", 0)) == 0:
        try:
            lock_run_dir(cfg.log.run_dir)
        except (RunDirBusy, UnsafePath) as e:
            print(f"train: {e}", file=sys.stderr)
            return 2
    return train(cfg)


if __name__ == "__main__":
    sys.exit(main())
