"""Length-generalisation evaluation of one training run (RLT paper, section 3.1, J.4, J.6).

    result = evaluate_run("runs/algorithmic/parity-rlt-transformer-8-s42")   # the task's whole test grid
    write_eval(result, out_dir)                                               # out_dir/eval.json

1. The checkpoint (`select_checkpoint`): the one with the minimum in-distribution validation loss,
   earliest step on exact ties (the paper: "minimum ID validation example loss ... earliest step on
   ties"; test scores never enter). The trainer records it in `<checkpoints>/best.json`
   (checkpoint.keep_best); a run without that file falls back to the same rule over the eval records
   of `<run_dir>/metrics.jsonl` whose checkpoint directory still exists and verifies. Nothing to
   choose from is refused (SelectionError). `checkpoint="last"` (the CLI's --checkpoint last) takes
   the fixed last step instead, train.max_steps (the paper's J.8 compares the two): a run that has
   not reached it is refused, naming the step; eval.json records the choice (`checkpoint_choice`).
2. The model: `rgpt_dist.checkpoints.consolidate.consolidate` of that tag (fp32 master weights, tp = 1)
   into `rgpt_dist.registry.build_model`, eval mode, fp32, CPU unless told otherwise.
3. Every test length (the task's grid, or a subset of it): the shared held-out set
   (`heldout_batches`), batch 32 (the paper's new evaluations), argmax at every position, the
   counts of rgpt_dist.algorithmic.metrics; also the pooled in-distribution validation accuracy of
   the same checkpoint (the validation grid, counts pooled: J.4).

`limit` (the CLI's --limit) scores only the first N examples of each set: for smoke tests, NOT the
paper's protocol (eval.json records it). Bad input raises EvalError (a ValueError) before any model
is loaded: an unknown task, a run not trained on a task, lengths outside the test grid, an empty grid,
a test sequence longer than model.block_size under learned positions.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from rgpt_dist.algorithmic import TaskError, get_task, heldout_batches, make_batch
from rgpt_dist.algorithmic.capped import capped
from rgpt_dist.algorithmic.metrics import Counts, count, primary_metric
from rgpt_dist.checkpoints.consolidate import consolidate
from rgpt_dist.checkpoints.record import verify
from rgpt_dist.progress import bar
from rgpt_dist.registry import build_model
from rgpt_dist.run_files import RunFileError, read_mapping
from rgpt_dist.strict_json import dumps
from rgpt_dist.train.checkpoint import read_best
from rgpt_dist.train.metrics import read_metrics

TAG_PREFIX = "step_"
BEST_FILE = "best.json"
RUN_RECORD = "algo_run.json"
"""Written by `rgpt-algo train` into the run directory: task, model flavour, seed, overrides."""
EVAL_BATCH = 32
CHECKPOINT_CHOICES = ("best", "last")
"""best: the minimum validation loss (earliest tie); last: the checkpoint at train.max_steps."""


class EvalError(ValueError):
    """Input the evaluation refuses, with the offending value named."""


class SelectionError(EvalError):
    """No checkpoint can be selected (none recorded, or the recorded one is gone)."""


@dataclass(frozen=True)
class Selection:
    tag_dir: Path
    step: int
    val_loss: float | None   # None: no validation record at that step (only possible for "last")
    source: str   # "best.json", "metrics.jsonl" or "train.max_steps"


def run_config(run_dir: str | Path) -> dict:
    """The resolved config the trainer wrote (RUN_DIR/config.yaml) as a mapping, read as data from a
    run that may be another user's (rgpt_dist.run_files: a regular file, bounded, aliases capped),
    its sections mappings."""
    path = Path(run_dir) / "config.yaml"
    if not Path(run_dir).is_dir():
        raise EvalError(f"run directory {run_dir} does not exist or is not a directory")
    if not path.exists() and not path.is_symlink():
        raise EvalError(f"{path} not found: {run_dir} is not a training run directory")
    try:
        config = read_mapping(path, "yaml")
        for section in ("model", "data", "train", "checkpoint", "eval", "parallel", "log"):
            config.mapping(section, optional=True)
    except RunFileError as e:
        raise EvalError(str(e)) from None
    return config.data


NAME = re.compile(r"[A-Za-z0-9_.+\-]{1,100}")
"""A task or flavour name as the task commands record it."""


def read_run_record(path: Path) -> dict:
    """RUN_DIR/algo_run.json (what `rgpt algo train` / `rgpt think train` recorded), its fields checked."""
    f = read_mapping(path)
    return {"task": f.str("task", pattern=NAME), "model": f.str("model", pattern=NAME),
            "seed": f.int("seed", lo=0, hi=2**32 - 1), "config": f.str("config", optional=True),
            "overrides": f.list("overrides", lambda o: isinstance(o, str) and len(o) <= 1000, "strings",
                                optional=True, max_len=1000) or [],
            "nproc": f.int("nproc", optional=True, lo=1, hi=1 << 20)}


def checkpoint_dir(run_dir: str | Path, config: dict) -> Path:
    """checkpoint.dir, or RUN_DIR/checkpoints (the trainer's default). A checkpoint.dir outside the run
    directory is followed only in the user's own runs: another user's run naming, say, a private
    model's checkpoints would otherwise have that model scored and its scores written into the run."""
    named = (config.get("checkpoint") or {}).get("dir") or ""
    if not isinstance(named, str):
        raise EvalError(f"{Path(run_dir) / 'config.yaml'}: checkpoint.dir must be a path, not {type(named).__name__}")
    if not named:
        return Path(run_dir) / "checkpoints"
    path, run = Path(named), Path(run_dir)
    inside = path.resolve().is_relative_to(run.resolve())
    owner = run.stat().st_uid
    if not inside and owner != os.getuid():
        raise EvalError(f"{run / 'config.yaml'}: checkpoint.dir={named!r} lies outside the run directory of "
                        f"another user (uid {owner}): refusing to evaluate checkpoints the run does not hold; "
                        f"copy the run with its checkpoints into a directory of your own")
    return path


def _complete(tag_dir: Path) -> bool:
    return tag_dir.is_dir() and not tag_dir.is_symlink() and verify(tag_dir) is None


def select_from_records(records: list[dict], exists) -> tuple[int, float] | None:
    """(step, val_loss) of the minimum finite val_loss among eval records whose checkpoint
    `exists(step)`, the earliest step on exact ties; None when there is none. A step evaluated twice
    (a resumed run) keeps its last record."""
    by_step = {}
    for r in records:
        loss = r.get("val_loss")
        if isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss):
            by_step[int(r["step"])] = float(loss)
    candidates = sorted((loss, step) for step, loss in by_step.items() if exists(step))
    return (candidates[0][1], candidates[0][0]) if candidates else None


def select_checkpoint(run_dir: str | Path, config: dict | None = None) -> Selection:
    """The checkpoint to evaluate (module doc, step 1)."""
    config = run_config(run_dir) if config is None else config
    ckpt = checkpoint_dir(run_dir, config)
    best = ckpt / BEST_FILE
    if best.exists() or best.is_symlink():
        try:
            rec = read_best(best)
        except RunFileError as e:
            raise SelectionError(str(e)) from None
        if not _complete(ckpt / rec.tag):
            raise SelectionError(f"{best} names {rec.tag}, which is missing or incomplete under {ckpt}")
        return Selection(ckpt / rec.tag, rec.step, rec.val_loss, "best.json")
    records = [r for _, r in read_metrics(Path(run_dir) / "metrics.jsonl") if "val_loss" in r]
    chosen = select_from_records(records, lambda step: _complete(ckpt / f"{TAG_PREFIX}{step:08d}"))
    if chosen is None:
        raise SelectionError(f"no checkpoint to select in {run_dir}: no {BEST_FILE} in {ckpt} and no validation "
                             f"record of metrics.jsonl has a complete checkpoint (train with eval.every_steps > 0 "
                             f"and checkpoints at the same steps)")
    step, loss = chosen
    return Selection(ckpt / f"{TAG_PREFIX}{step:08d}", step, loss, "metrics.jsonl")


def select_last(run_dir: str | Path, config: dict | None = None) -> Selection:
    """The checkpoint at train.max_steps (the fixed last step), its validation loss from
    metrics.jsonl (the last record at that step; None without one); SelectionError when the run
    has not saved that step completely."""
    config = run_config(run_dir) if config is None else config
    steps = (config.get("train") or {}).get("max_steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise SelectionError(f"{run_dir}: config.yaml has no positive train.max_steps ({steps!r}) to take the last "
                             f"checkpoint at")
    tag_dir = checkpoint_dir(run_dir, config) / f"{TAG_PREFIX}{steps:08d}"
    if not _complete(tag_dir):
        raise SelectionError(f"no last checkpoint in {run_dir}: {tag_dir} (train.max_steps={steps}) is missing or "
                             f"incomplete; the run has not finished (run it again to resume) or it was pruned")
    losses = [r["val_loss"] for _, r in read_metrics(Path(run_dir) / "metrics.jsonl")
              if r.get("step") == steps and isinstance(r.get("val_loss"), (int, float))]
    return Selection(tag_dir, steps, float(losses[-1]) if losses else None, "train.max_steps")


def eval_lengths(task, lengths=None) -> list:
    """The lengths to evaluate: the task's test grid, or `lengths` (each must be in that grid)."""
    grid = list(task.lengths("test"))
    if lengths is None:
        return grid
    if len(lengths) == 0:
        raise EvalError(f"task {task.name!r}: the list of lengths is empty (its test grid: {tuple(grid)})")
    try:
        for n in lengths:
            task.check_length(n, "test")
    except TaskError as e:
        raise EvalError(str(e)) from None
    return sorted(dict.fromkeys(int(n) for n in lengths))


def check_positions(task, lengths, model_cfg: dict) -> None:
    """Under learned positions a sequence longer than block_size cannot run: refuse it, naming it."""
    if model_cfg.get("pos_encoding", "learned") != "learned":
        return
    block = int(model_cfg.get("block_size", 0))
    for n in lengths:
        tokens = task.max_tokens(n)
        if tokens > block:
            raise EvalError(f"task {task.name!r}: test length {n} needs {tokens} tokens but model.block_size={block} "
                            f"with model.pos_encoding=learned (no position past {block - 1}); evaluate lengths whose "
                            f"sequences fit, or train with pos_encoding rope, alibi or none")


def _task_of(config: dict):
    name = (config.get("data") or {}).get("task", "")
    if not name:
        raise EvalError("the run was not trained on an algorithmic task (its data.task is empty)")
    try:
        return get_task(name)
    except TaskError as e:
        raise EvalError(str(e)) from None


def score(model, batches, device: str = "cpu") -> Counts:
    """Pooled counts of `batches` (Batch objects): argmax of the fp32 logits at every position."""
    total = Counts()
    with torch.no_grad():
        for b in batches:
            logits = model(torch.from_numpy(b.tokens).to(device)).logits      # [B, T, V]
            predictions = logits.float().argmax(-1).cpu().numpy()             # [B, T]
            total = total + count(predictions, b.targets, b.mask)
    return total


def _batches(task, split: str, length, limit: int | None, batch_size: int):
    """The held-out set of one length in order (heldout_batches), or its first `limit` examples."""
    size = task.set_size(split)
    if limit is None or limit >= size:
        return heldout_batches(task, split, length, batch_size)
    return (make_batch(task, split, range(s, min(limit, s + batch_size)), length)
            for s in range(0, limit, batch_size))


def model_label(run_dir: Path, config: dict) -> tuple[str, dict]:
    """The model's name for tables (the flavour `rgpt-algo train` or `rgpt-think train` recorded, else family + layer count)
    and the run record (empty when the run was started another way)."""
    path = run_dir / RUN_RECORD
    try:
        record = read_run_record(path) if path.exists() or path.is_symlink() else {}
    except RunFileError as e:
        raise EvalError(str(e)) from None
    model = config.get("model") or {}
    label = record.get("model") or f"{model.get('family', '?')}-{model.get('n_layer', '?')}L"
    # model fields changed on the command line change the model: name them (`rlt-debug n_dec=1`)
    changed = [o.split("=", 1) for o in record.get("overrides") or []
               if o.startswith("model.") and "=" in o and not o.startswith("model.flavour=")]
    label = " ".join([str(label), *(f"{k[len('model.'):]}={v}" for k, v in changed)])
    return label, record


def evaluate_run(run_dir: str | Path, lengths=None, limit: int | None = None, batch_size: int = EVAL_BATCH,
                 device: str = "cpu", trust: bool = False, checkpoint: str = "best") -> dict:
    """The eval.json record of one run (module doc); `checkpoint` best or last. Every refusal happens
    before the model loads."""
    if checkpoint not in CHECKPOINT_CHOICES:
        raise EvalError(f"checkpoint must be one of {', '.join(CHECKPOINT_CHOICES)}, got {checkpoint!r}")
    run_dir = Path(run_dir)
    config = run_config(run_dir)
    task = _task_of(config)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise EvalError(f"limit must be a positive integer, got {limit!r}")
    grid = eval_lengths(task, lengths)
    check_positions(task, grid, config.get("model") or {})
    selection = (select_checkpoint if checkpoint == "best" else select_last)(run_dir, config)
    model, step = load_model(selection.tag_dir, device, trust, config)
    val = {}
    pooled = Counts()
    for n in task.lengths("val"):
        c = score(model, _batches(task, "val", n, limit, batch_size), device)
        val["pooled" if n is None else str(n)] = c.to_dict()
        pooled = pooled + c
    test = {str(n): score(model, _batches(task, "test", n, limit, batch_size), device).to_dict()
            for n in bar(grid, desc=f"{task.name} test lengths", unit="length")}
    label, record = model_label(run_dir, config)
    metric = primary_metric(task.name)
    trained = trained_lengths(task, run_dir, config, step)
    return {"task": task.name, "model": label, "family": (config.get("model") or {}).get("family"),
            "seed": (config.get("train") or {}).get("seed"), "step": step, "checkpoint": selection.tag_dir.name,
            "checkpoint_choice": checkpoint, "selected_by": selection.source, "val_loss": selection.val_loss,
            "primary_metric": metric,
            "limit": limit, "protocol": "paper" if limit is None else f"first {limit} examples per length (not the paper's)",
            "batch_size": batch_size, "dtype": "fp32", "device": device,
            "validation": {"accuracy": pooled.accuracy(metric), "pooled": pooled.to_dict(), "per_length": val},
            "test": test, "run_dir": str(run_dir.resolve()), "overrides": record.get("overrides", []),
            "train_lengths": [min(trained), max(trained)]}


def trained_lengths(task, run_dir: Path, config: dict, step: int) -> tuple[int, ...]:
    """The training lengths the run had reached at `step`: data.task_train_max's grid, widened by the
    growths of a length curriculum that metrics.jsonl records before that step."""
    cap = int((config.get("data") or {}).get("task_train_max") or 0)
    grown = [r["task_train_max"] for _, r in read_metrics(Path(run_dir) / "metrics.jsonl")
             if isinstance(r.get("task_train_max"), int) and r.get("step", step) < step] if cap else []
    return capped(task, max([cap, *grown])).train_lengths


def load_model(tag_dir: Path, device: str, trust: bool, config: dict | None = None):
    """The checkpoint's model (fp32, eval mode, on `device`) and its step. With the run's `config`
    (config.yaml), the checkpoint must be the run's: the model, the task and the seed the evaluation
    reports from config.yaml are the ones the checkpoint was trained with."""
    c = consolidate(tag_dir, trust=trust)
    if config is not None:
        _check_same_run(config, c.config.to_dict(), tag_dir)
    model = build_model(c.config.model)
    model.load_state_dict(c.state_dict, strict=True)
    return model.to(device=device, dtype=torch.float32).eval(), c.step


def _check_same_run(config: dict, trained: dict, tag_dir: Path) -> None:
    """EvalError naming the first field where the run's config.yaml contradicts its checkpoint's config:
    every model field config.yaml holds (a run written before a field existed lacks it: not a
    contradiction), and the task and seed the evaluation reports."""
    plain = lambda v: json.loads(json.dumps(v))  # noqa: E731 (tuples and lists alike, as YAML reads them)
    written = config.get("model") or {}
    model_keys = [k for k in trained.get("model") or {} if k in written]
    for section, key in [*(("model", k) for k in model_keys), ("data", "task"), ("train", "seed")]:
        want, got = (trained.get(section) or {}).get(key), (config.get(section) or {}).get(key)
        if plain(got) != plain(want):
            raise EvalError(f"config.yaml's {section}.{key}={got!r} contradicts the checkpoint {tag_dir}, trained "
                            f"with {section}.{key}={want!r}: the run directory's config is not its checkpoint's")


def write_eval(result: dict, out: Path) -> Path:
    """out/eval.json, strict JSON (NaN/inf as null)."""

    path = Path(out) / "eval.json"
    path.write_text(dumps(result, indent=1) + "\n")
    return path
