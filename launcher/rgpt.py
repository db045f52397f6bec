"""rgpt: one command for what rgpt-dist runs.

    rgpt train configs/experiments/quickstart.yaml train.max_steps=500 --nproc 2   # torchrun on this node
    rgpt prep python-stdlib --out data/python-stdlib --seq-len 1024                 # text -> token shards
    rgpt export runs/quickstart exports/quickstart                                 # -> native + Hugging Face
    rgpt eval curve exports/quickstart --out eval/quickstart                       # early exits, diagnostics, lm-eval
    rgpt flops recurrentgpt-large-isoflops                                         # parameters and FLOPs
    rgpt algo train parity --model rlt-debug --seed 42 --out runs/parity            # the algorithmic suite
    rgpt think train graph --model thinking-graph-debug --seed 42 --out runs/graph  # silent thinking
    rgpt study compare run --data data/python-stdlib --out runs/compare          # a study: train, report

`rgpt VERB --help` prints the verb's own help, with its examples. The verbs other than `train` and
`study` are the former `rgpt-prep`, `rgpt-export`, `rgpt-eval`, `rgpt-flops`, `rgpt-algo` and `rgpt-think`,
which still work for this release and say so on stderr (as do `launcher/compare.py`, `phi.py` and
`ablation.py`, now `rgpt study`). On a SLURM cluster, `sbatch slurm/*.sh`
starts training (docs/cluster.md).
"""
from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
from typing import Callable

from rgpt_dist import progress
from rgpt_dist.config import ConfigError, load_config

# verb -> ("module:function" taking argv, one line for `rgpt --help`)
VERBS: dict[str, tuple[str, str]] = {
    "train": ("launcher.rgpt:train", "train a config on this node (torchrun or the deepspeed launcher)"),
    "prep": ("data_prep.cli:main", "tokenize text (JSONL, Parquet, the embedded corpus) into shards, local or s3://"),
    "export": ("launcher.export:main", "a run's checkpoint -> native and Hugging Face models with the tokenizer"),
    "eval": ("launcher.eval:main", "early-exit curves, Appendix E diagnostics, lm-eval, the grid table, phi"),
    "flops": ("launcher.flops:main", "parameters and FLOPs per flavour; solve a shape for a FLOPs budget"),
    "algo": ("rgpt_dist.algorithmic.cli:main", "the algorithmic suite: train, evaluate over lengths, tables"),
    "think": ("rgpt_dist.thinking.cli:main", "silent thinking: train, the computational frontier, tables"),
    "study": ("launcher.study:main", "the studies: compare, ablation, phi, rt-compare, rlt, thinking ... run|report|grid"),
}


def _entry(verb: str) -> Callable[[list[str]], int]:
    module, function = VERBS[verb][0].split(":")
    return getattr(importlib.import_module(module), function)


def main(argv: list[str] | None = None) -> int:
    verbs = "\n".join(f"  {v:8s}{line}" for v, (_, line) in VERBS.items())
    parser = argparse.ArgumentParser(prog="rgpt", description=__doc__.split("\n", 1)[0],
                                     epilog=f"verbs:\n{verbs}\n\nexamples:\n{__doc__.split(chr(10), 2)[2]}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bars (they are drawn only on a terminal anyway), here and in what it starts")
    parser.add_argument("verb", choices=VERBS, metavar="VERB", help="one of: " + ", ".join(VERBS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the verb's own arguments (rgpt VERB --help)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.quiet:
        progress.quiet()
    return _entry(args.verb)(args.args)


def train(argv: list[str]) -> int:
    """`rgpt train CONFIG [key=value ...]`: validate the config here, print the launch command, run it."""
    parser = argparse.ArgumentParser(
        prog="rgpt train", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train CONFIG with key=value overrides on this node. The config is validated first "
                    "(exit 2 naming every bad value, before any process starts); then the command that "
                    "launches the ranks is printed and run. Several nodes: sbatch slurm/*.sh (docs/cluster.md).",
        epilog="examples:\n"
               "  rgpt train configs/experiments/quickstart.yaml --nproc 2\n"
               "  rgpt train configs/experiments/recurrentgpt-medium-isoflops-20k.yaml train.seed=1 --nproc 8\n"
               "  rgpt train configs/experiments/quickstart.yaml --launcher deepspeed --nproc 2 --dry-run")
    parser.add_argument("config", help="an experiment YAML (configs/experiments/*.yaml) or a flavour name")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (train.max_steps=500, model=NAME, ...)")
    parser.add_argument("--nproc", type=int, default=None,
                        help="ranks on this node (default: the visible GPUs, else 1)")
    parser.add_argument("--launcher", choices=("torchrun", "deepspeed"), default="torchrun")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the command, do not run it")
    args = parser.parse_args(argv)

    try:
        load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"rgpt train: {e}", file=sys.stderr)
        return 2
    nproc = args.nproc if args.nproc is not None else _visible_gpus() or 1
    if nproc < 1:
        print(f"rgpt train: --nproc {nproc} must be >= 1", file=sys.stderr)
        return 2
    command = _command(args.launcher, nproc, args.config, args.overrides)
    print(shlex.join(command), flush=True)
    if args.dry_run:
        return 0
    os.execv(command[0], command)
    return 0  # not reached


def _command(launcher: str, nproc: int, config: str, overrides: list[str]) -> list[str]:
    if launcher == "deepspeed":
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
        return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(nproc), script, config, *overrides]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "launcher.train", config, *overrides]


def _visible_gpus() -> int:
    """The GPUs torch sees here (0 without CUDA), without initialising CUDA in this process."""
    import torch  # torch only here: the module's other functions run without it

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _legacy(verb: str) -> Callable[[], int]:
    """The former `rgpt-VERB` console script: the verb, after a one-line notice on stderr."""
    def run() -> int:
        print(f"rgpt-{verb}: this name is deprecated and goes after this release; use `rgpt {verb}`",
              file=sys.stderr)
        return _entry(verb)(sys.argv[1:])
    return run


legacy_prep, legacy_export, legacy_eval, legacy_flops, legacy_algo, legacy_think = (
    _legacy(v) for v in ("prep", "export", "eval", "flops", "algo", "think"))


if __name__ == "__main__":
    sys.exit(main())
