"""rgpt-algo: the RLT paper's algorithmic length-generalisation protocol, one command per step.

    rgpt-algo train parity --model rlt-transformer-8 --seed 42 --out runs/algorithmic/parity-rlt-transformer-8-s42
    rgpt-algo train s5_swaps --model rlt-transformer-debug --seed 43 --out RUN --nproc 1 train.max_steps=200
    rgpt-algo eval RUN                              # RUN/eval/eval.json: the task's whole test grid
    rgpt-algo eval RUN --lengths 32,64 --out DIR    # a subset of the grid
    rgpt-algo eval RUN --lengths 32 --limit 64      # first 64 examples per length: smoke runs, NOT the paper's protocol
    rgpt-algo eval RUN --checkpoint last            # RUN/eval-last/eval.json: the fixed last step (train.max_steps)
    rgpt-algo table runs/algorithmic --out runs/algorithmic/table   # table.md, table.json, accuracy_vs_length.png
    rgpt-algo table runs/algorithmic --out T --layout table9        # only the paper's Table 9 layout
    rgpt-algo table runs/cpu --out T --layout table9 --models rlt1-debug,rlt0-debug,rlt2-debug,rlt-transformer-debug

train: configs/algorithmic/TASK.yaml (the paper's recipe) + model=FLAVOUR + train.seed=S +
log.run_dir=OUT + the key=value overrides, validated here (a bad value exits 2 naming it, before any
process starts), then the project's trainer through torchrun (--nproc processes, default 1; the
paper ran one CPU process with four threads). An interrupted run resumes from its newest checkpoint.
eval: the checkpoint with the minimum validation loss (best.json, else metrics.jsonl; earliest step on
ties), or with --checkpoint last the one at train.max_steps; every test length of the task, fp32,
batch 32 (rgpt_dist.algorithmic.evaluate).
table: mean and sample SD (ddof = 1) over the seeds of each (task, model, checkpoint choice)
(rgpt_dist.algorithmic.table); --layout auto (default: the generic layouts and every paper layout
with data), full, or paper layouts table2 / table7 / table9 (rgpt_dist.algorithmic.paper_tables).
Exit status 2 with one line on bad input; train passes on the trainer's status.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from rgpt_dist.algorithmic import TASKS, TaskError
from rgpt_dist.algorithmic.evaluate import EvalError, evaluate_run, write_eval
from rgpt_dist.algorithmic.table import TableError, check_layouts, load_evals, write_tables
from rgpt_dist.run_files import RunFileError
from rgpt_dist.checkpoints.consolidate import ExportError
from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.durable import UnsafePath, atomic_write_text
from rgpt_dist.safe_paths import UnsafeOutput, out_dir, publish, staging
from rgpt_dist.sections import literal_override
from rgpt_dist.train.preflight import preflight

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "configs" / "algorithmic"
PROG = "rgpt-algo"


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: {message} (see {PROG} --help)\n")


class Refused(Exception):
    """Bad input: printed as one line, exit status 2."""


def _lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lengths {text!r} must be comma-separated integers") from None
    return values


def _names(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing (comma-separated names)")
    return names


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    t = sub.add_parser("train", help="train one (task, model, seed) run with the paper's recipe")
    t.add_argument("task", help="parity, s5_standard, s5_swaps, mod5_flat, mod5_brackets or addition")
    t.add_argument("--model", required=True, help="model flavour (e.g. rlt-transformer-8)")
    t.add_argument("--seed", type=int, required=True, help="initialisation seed (the paper: 42, 43, 44)")
    t.add_argument("--out", required=True, help="run directory (log.run_dir)")
    t.add_argument("--nproc", type=_positive, default=1, help="training processes (default 1)")
    t.add_argument("overrides", nargs="*", help="key=value config overrides, applied last")
    e = sub.add_parser("eval", help="evaluate a run's best checkpoint over the task's test lengths")
    e.add_argument("run_dir")
    e.add_argument("--lengths", type=_lengths, help="comma-separated subset of the task's test grid")
    e.add_argument("--limit", type=_positive, help="score only the first N examples per length (smoke runs; "
                                                   "not the paper's protocol)")
    e.add_argument("--batch-size", type=_positive, default=32, help="examples per forward (default 32)")
    e.add_argument("--device", default="cpu", help="cpu (default; the paper's FP32 CPU evaluation) or cuda[:N]")
    e.add_argument("--checkpoint", choices=("best", "last"), default="best",
                   help="best: minimum validation loss, earliest tie (default); last: the step train.max_steps")
    e.add_argument("--out", help="output directory (default RUN_DIR/eval; RUN_DIR/eval-last with --checkpoint last)")
    e.add_argument("--trust-checkpoint", action="store_true",
                   help="UNSAFE: load checkpoint files that need full unpickling (runs code the file names)")
    s = sub.add_parser("table", help="three-seed tables and plot of eval.json files")
    s.add_argument("sources", nargs="+", help="eval.json files or directories searched for them")
    s.add_argument("--out", required=True, help="output directory")
    s.add_argument("--layout", type=_names, default=("auto",),
                   help="comma-separated: auto (default), full, table2, table7, table9")
    s.add_argument("--models", type=_names, help="flavours replacing one paper layout's models, in order "
                                                  "(with --layout naming that layout)")
    return p


def train_overrides(args) -> list[str]:
    """What `train` adds to the task's config, in order (the user's overrides last)."""
    return [f"model={args.model}", f"train.seed={args.seed}", literal_override("log.run_dir", str(args.out)),
            literal_override("log.name", Path(args.out).name), *args.overrides]


def task_config(task: str) -> Path:
    """configs/algorithmic/TASK.yaml; Refused naming the task and the known ones."""

    if task not in TASKS:
        raise Refused(f"unknown task {task!r}: expected one of {', '.join(sorted(TASKS))}")
    path = CONFIG_DIR / f"{task}.yaml"
    if not path.is_file():
        raise Refused(f"{path} is missing")
    return path


def train(args) -> int:
    return launch(args, task_config(args.task))


def launch(args, config: Path) -> int:
    """Validates config + the arguments' overrides for args.nproc processes (Refused naming every
    problem), records the run (RUN_DIR/algo_run.json) and runs the trainer (rgpt-think's train too)."""

    args.out = str(out_dir(args.out))          # absolute: the record and the trainer agree on it
    overrides = train_overrides(args)
    try:
        cfg = load_config(config, overrides)
        problems = preflight(cfg, args.nproc)
        if problems:
            raise ConfigError(problems)
    except ConfigError as e:
        raise Refused("invalid config: " + "; ".join(e.problems)) from None
    if cfg.data.task != args.task:
        raise Refused(f"data.task={cfg.data.task!r} contradicts the task {args.task!r} (drop that override)")
    run_dir = Path(args.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "algo_run.json", json.dumps(
        {"task": args.task, "model": args.model, "seed": args.seed, "config": str(config), "overrides": overrides,
         "nproc": args.nproc}, indent=1) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.setdefault("OMP_NUM_THREADS", "1" if args.nproc > 1 else "4")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "-m", "launcher.train", str(config),
               *overrides]
    return _run_forwarding(command, env)


def _run_forwarding(command: list[str], env: dict) -> int:
    """Runs the trainer, passing SIGUSR1 / SIGTERM / SIGINT on to torchrun (which passes them to the
    ranks: they save the step and exit, rgpt_dist/train/preemption.py); returns its exit status."""
    proc = subprocess.Popen(command, env=env)     # the caller's directory: relative overrides keep their meaning
    forward = lambda signum, frame: proc.send_signal(signum)  # noqa: E731
    previous = {s: signal.signal(s, forward) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def evaluate(args) -> int:
    result = evaluate_run(args.run_dir, args.lengths, args.limit, args.batch_size, args.device,
                          args.trust_checkpoint, args.checkpoint)
    default = Path(args.run_dir) / ("eval" if args.checkpoint == "best" else "eval-last")
    path = _write_into(args.out or default, lambda tmp: write_eval(result, tmp))
    metric = result["primary_metric"]
    val, loss = result["validation"]["accuracy"], result["val_loss"]
    val_text = "n/a" if val is None else f"{100 * val:.2f}%"
    print(f"{result['task']} {result['model']} seed {result['seed']}: {result['checkpoint']} ({args.checkpoint}; "
          f"val_loss {'n/a' if loss is None else f'{loss:.4g}'}, validation {metric} accuracy {val_text})")
    for n, m in result["test"].items():
        print(f"  length {n}: {metric} accuracy {100 * m[metric]:.2f}%")
    print(f"wrote {path}")
    return 0


def table(args) -> int:
    check_layouts(args.layout, args.models)
    evals = load_evals(args.sources)
    paths = _write_into(args.out, lambda tmp: write_tables(evals, tmp, args.layout, args.models))
    print(Path(paths["md"]).read_text())
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


def _write_into(out, write):
    """Runs write(staging_dir) inside OUT and moves its files into OUT (links and files at OUT are
    refused: rgpt_dist.safe_paths); returns write's result with paths rewritten into OUT."""

    out = out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    with staging(out, ".rgpt-algo-partial-") as tmp:
        result = write(tmp)
        publish(tmp, out)
    if isinstance(result, dict):
        return {k: out / Path(v).name for k, v in result.items()}
    return out / Path(result).name


def parse(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The arguments (of `parser`, default rgpt-algo's; rgpt-think's shares the rule): train's
    key=value overrides may come before or after its options."""
    parser = parser or _parser()
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if args.command != "train" or a.startswith("-") or "=" not in a]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if args.command == "train":
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
    except SystemExit as e:            # a usage error (one line printed, status 2) or --help (0)
        return e.code if isinstance(e.code, int) else 2

    refusals = (Refused, EvalError, TableError, TaskError, UnsafeOutput, UnsafePath, RunFileError,
                FileNotFoundError, ExportError)
    try:
        return {"train": train, "eval": evaluate, "table": table}[args.command](args)
    except refusals as e:
        print(f"{PROG}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
