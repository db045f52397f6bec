"""rgpt-think: the silent-thinking study, one command per step (docs/thinking.md).

    rgpt-think train graph --model thinking-graph --seed 42 --out runs/thinking/graph-s42
    rgpt-think train graph --model thinking-graph-debug --seed 43 --out RUN train.max_steps=2000
    rgpt-think train graph --model thinking-graph --seed 42 --out RUN model.supervision_alpha=0.5
    rgpt-think frontier RUN                       # RUN/frontier: the task's (difficulty x steps) grid
    rgpt-think frontier RUN --difficulties 2,4,6 --steps 1,2,4,8 --n 200 --out DIR
    rgpt-think table runs/thinking --out runs/thinking/table      # mean ± SD over seeds, heatmaps

train: configs/thinking/TASK.yaml (the authors' recipe) + model=FLAVOUR + train.seed=S +
log.run_dir=OUT + the key=value overrides, validated before any process starts (exit 2 naming the
value), then the project's trainer through torchrun (--nproc processes, default 1), as rgpt-algo's.
frontier: the last checkpoint (--checkpoint best: minimum validation loss), every test difficulty
of the task and every thinking step of the authors' grid (rgpt_dist.thinking.frontier).
table: every frontier.json under the sources grouped by (task, model); mean and sample SD over seeds.
Exit status 2 with one line on bad input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rgpt_dist.algorithmic.cli import ROOT, Refused, _positive, _write_into, launch, parse
from rgpt_dist.algorithmic.evaluate import EvalError
from rgpt_dist.checkpoints.consolidate import ExportError
from rgpt_dist.durable import UnsafePath
from rgpt_dist.safe_paths import UnsafeOutput
from rgpt_dist.run_files import RunFileError
from rgpt_dist.thinking.frontier import FrontierError, frontier_run, load_frontiers, write_frontier, write_table
from rgpt_dist.thinking.tasks import TASKS, ThinkingTaskError

CONFIG_DIR = ROOT / "configs" / "thinking"
PROG = "rgpt-think"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{PROG}: {message} (see {PROG} --help)\n")


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated integers") from None


MAX_BUCKET = 100_000
"""frontier --n at most: each example is built before its bucket is scored (~1-2 KiB apiece, measured on the
graph and relational tasks: < 200 MiB), 50 x the authors' largest bucket (2,000)."""
MAX_BATCH = 1_000
"""frontier --batch-size at most: one forward holds ~2.5 MiB of activations per example on the 128-token
tasks (logic, relational; measured on CPU at d_model 256): ~2.5 GiB at the cap, 10 x the default."""


def _at_most(cap: int, what: str):
    """argparse type: a positive integer <= cap (argparse names the option; exit status 2)."""
    def parse(text: str) -> int:
        value = _positive(text)
        if value > cap:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: at most {cap:,} ({what})")
        return value
    return parse


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    t = sub.add_parser("train", help="train one (task, model, seed) run with the authors' recipe")
    t.add_argument("task", help="graph, logic or relational")
    t.add_argument("--model", required=True, help="flavour (thinking-graph, thinking-graph-debug, thinking-logic-fixed, ...)")
    t.add_argument("--seed", type=int, required=True, help="initialisation seed (the authors: 42, 43, 44)")
    t.add_argument("--out", required=True, help="run directory (log.run_dir)")
    t.add_argument("--nproc", type=_positive, default=1, help="training processes (default 1)")
    t.add_argument("overrides", nargs="*", help="key=value config overrides, applied last")
    f = sub.add_parser("frontier", help="accuracy over (difficulty x thinking steps) of a run's checkpoint")
    f.add_argument("run_dir")
    f.add_argument("--difficulties", type=_ints, help="comma-separated (default: the authors' test grid)")
    f.add_argument("--steps", type=_ints, help="comma-separated thinking steps (default: the authors' grid)")
    f.add_argument("--n", type=_at_most(MAX_BUCKET, "examples per difficulty, all built before scoring"),
                   help=f"examples per difficulty, even (default: the authors' bucket; at most {MAX_BUCKET:,})")
    f.add_argument("--batch-size", type=_at_most(MAX_BATCH, "examples per forward, ~2.5 MiB of activations each"),
                   default=100, help=f"examples per forward (default 100, at most {MAX_BATCH:,})")
    f.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    f.add_argument("--checkpoint", choices=("last", "best"), default="last",
                   help="last: train.max_steps (default, the authors'); best: minimum validation loss")
    f.add_argument("--out", help="output directory (default RUN_DIR/frontier)")
    f.add_argument("--trust-checkpoint", action="store_true",
                   help="UNSAFE: load checkpoint files that need full unpickling (runs code the file names)")
    s = sub.add_parser("table", help="mean and SD over seeds of frontier.json files")
    s.add_argument("sources", nargs="+", help="frontier.json files or directories searched for them")
    s.add_argument("--out", required=True, help="output directory")
    return p


def train(args) -> int:
    if args.task not in TASKS:
        raise Refused(f"unknown thinking task {args.task!r}: expected one of {', '.join(TASKS)}")
    config = CONFIG_DIR / f"{args.task}.yaml"
    if not config.is_file():
        raise Refused(f"{config} is missing")
    return launch(args, config)


def frontier(args) -> int:
    result = frontier_run(args.run_dir, args.difficulties, args.steps, args.n, args.batch_size, args.device,
                          args.trust_checkpoint, args.checkpoint)
    paths = _write_into(args.out or Path(args.run_dir) / "frontier", lambda tmp: write_frontier(result, tmp))
    print(Path(paths["md"]).read_text())
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


def table(args) -> int:
    paths = _write_into(args.out, lambda tmp: write_table(load_frontiers(args.sources), tmp))
    print(Path(paths["md"]).read_text())
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv, _parser())
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2

    refusals = (Refused, EvalError, FrontierError, ThinkingTaskError, UnsafeOutput, UnsafePath, RunFileError,
                FileNotFoundError, ExportError)
    try:
        return {"train": train, "frontier": frontier, "table": table}[args.command](args)
    except refusals as e:
        print(f"{PROG}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
