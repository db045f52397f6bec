"""Zero-shot downstream evaluation of exported checkpoints with lm-evaluation-harness (SPEC section 5,
Table 2), offline, plus an independent multiple-choice accuracy computation to check it against.

- `run_lm_eval(hf_dir, tasks)`: `lm_eval.simple_evaluate` on an `rgpt-export` Hugging Face directory
  (model "hf"; remote code only as rgpt_dist.export.remote_code's policy allows); the bundled tasks (`TASKS_DIR`, e.g. `rgpt_example`) are always
  on the include path. Returns the per-task metrics.
- `depth_sweep(hf_dir, tasks, depths)`: the same at each inference depth R* of a RecurrentGPT export,
  passed as the `r_eval=R*` from_pretrained override in model_args.
- `write_results(results, out_dir)`: JSON + CSV (one row per task x depth).

Our own scoring, and what it reproduces of lm-eval, is in rgpt_dist/eval/scoring.py.
"""
from __future__ import annotations

import csv
import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rgpt_dist import strict_json
from rgpt_dist.export.remote_code import trust_remote_code

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
EXAMPLE_TASK = "rgpt_example"
EXAMPLE_DATA = TASKS_DIR / "rgpt_example" / "rgpt_example.jsonl"
RESULTS_JSON = "lm_eval_results.json"
RESULTS_CSV = "lm_eval_results.csv"

# the tasks bundled with rgpt-dist: name -> local data file (for own_accuracy)
BUNDLED_TASK_DATA = {EXAMPLE_TASK: EXAMPLE_DATA}


class HarnessError(ValueError):
    """A request the harness cannot run (unknown task, depth sweep of a model without r_eval, ...)."""


# ----------------------------------------------------------------------------------- task lookup

def include_paths(include_path: str | Path | Sequence[str | Path] | None = None) -> list[Path]:
    """The bundled tasks folder followed by the caller's folders (later ones win on a name clash)."""
    extra = [] if include_path is None else (
        [include_path] if isinstance(include_path, (str, Path)) else list(include_path))
    paths = [TASKS_DIR]
    for p in extra:
        p = Path(p).expanduser().resolve()
        if not p.exists():
            raise HarnessError(f"include_path {p} does not exist")
        if p not in paths:
            paths.append(p)
    return paths


def make_task_manager(tasks: Sequence[str], include_path=None):
    """A lm-eval TaskManager that knows every name in `tasks`. Indexing lm-eval's ~15k built-in task
    YAMLs takes seconds, so the include paths alone are tried first and the built-ins only when a
    name is not found there. An unknown name raises HarnessError listing close matches."""
    from lm_eval.tasks import TaskManager  # lm-eval (seconds to import) only for `rgpt eval lm-eval`

    paths = [str(p) for p in include_paths(include_path)]
    tasks = _task_list(tasks)

    def missing(tm):
        return [t for t in tasks if t not in tm.all_tasks and not _is_yaml_file(t)]

    tm = TaskManager(include_path=paths, include_defaults=False)
    if not missing(tm):
        return tm
    tm = TaskManager(include_path=paths, include_defaults=True)
    unknown = missing(tm)
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, tm.all_tasks, n=5, cutoff=0.6)
            hints.append(f"{name!r}" + (f" (did you mean: {', '.join(close)}?)" if close else ""))
        raise HarnessError(
            f"unknown lm-eval task(s): {'; '.join(hints)}. Searched lm-eval's built-in tasks and "
            f"{', '.join(paths)}; list them with `python -m lm_eval ls tasks --include_path DIR`.")
    return tm


def _is_yaml_file(spec: str) -> bool:
    return spec.endswith((".yaml", ".yml")) and Path(spec).is_file()


def _task_list(tasks: str | Iterable[str]) -> list[str]:
    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",")]
    out = [str(t) for t in tasks if str(t)]
    if not out:
        raise HarnessError("no task given")
    return out


# ------------------------------------------------------------------------------------ lm-eval runs

def parse_model_args(extra: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """`"r_eval=4,kv_strategy=last"` (lm-eval's syntax, values typed as lm-eval types them) or a dict."""
    if extra is None:
        return {}
    if isinstance(extra, str):
        from lm_eval.utils import simple_parse_args_string  # lm-eval (seconds to import) only for `rgpt eval lm-eval`
        return dict(simple_parse_args_string(extra))
    return dict(extra)


def model_args_string(model_args: Mapping[str, Any]) -> str:
    """The `--model_args` string lm-eval's command line would take for these arguments."""
    return ",".join(f"{k}={v}" for k, v in model_args.items())


def hf_model_args(hf_dir: str | Path, model_args_extra=None, remote_code: str = "auto") -> dict[str, Any]:
    """lm-eval's model_args for hf_dir; `trust_remote_code` as the `remote_code` policy decides
    (rgpt_dist.export.remote_code: "auto", "never" or "trust"; auto and never also refuse an export by
    which transformers would load code or files from outside it); `use_cache=False` unless
    model_args_extra sets it; `local_files_only` and `use_safetensors` always."""

    hf_dir = Path(hf_dir).expanduser().resolve()
    if not (hf_dir / "config.json").is_file():
        raise HarnessError(f"{hf_dir} is not a Hugging Face model directory (no config.json); "
                           f"`rgpt-export RUN OUT` writes one to OUT/hf")
    task = model_config(hf_dir).get("rgpt_task")  # rgpt_dist.export.tokenizer_files.write_task_tokenizer
    if task:
        raise HarnessError(f"{hf_dir} is a model of the algorithmic task {task!r} (its tokenizer reads that task's "
                           f"symbols only): lm-eval's text tasks do not apply; evaluate its run with `rgpt-algo eval RUN`")
    extra = parse_model_args(model_args_extra)
    if "pretrained" in extra or "trust_remote_code" in extra:
        raise HarnessError("model_args_extra must not set `pretrained` (pass the directory as hf_dir) or "
                           "`trust_remote_code` (pass remote_code='auto'|'never'|'trust')")
    # use_cache=False: lm-eval's scoring forwards (loglikelihood, multiple choice) then build no KV cache,
    # which for a recurrent export preallocates block_size tokens for every cached layer on each call;
    # its generation passes use_cache=True to generate() itself, so generate_until tasks still cache.
    # local_files_only, use_safetensors: the model loads from this directory's files alone (no hub, no cache
    # of another repository's code) and never unpickles a weights file; rgpt-export writes safetensors
    args = {"pretrained": str(hf_dir), "local_files_only": True, "use_safetensors": True,
            "trust_remote_code": trust_remote_code(hf_dir, remote_code), "use_cache": False}
    args.update(extra)
    return args


def run_lm_eval(hf_dir: str | Path, tasks: str | Sequence[str] = (EXAMPLE_TASK,), *,
                include_path: str | Path | Sequence[str | Path] | None = None,
                model_args_extra: str | Mapping[str, Any] | None = None, batch_size: int | str = 1,
                limit: int | float | None = None, device: str = "cpu", num_fewshot: int | None = None,
                log_samples: bool = False, bootstrap_iters: int = 100000,
                task_manager=None, remote_code: str = "auto") -> dict[str, Any]:
    """lm-eval's "hf" model on the exported directory `hf_dir` (remote code as the `remote_code`
    policy allows, plus `model_args_extra`, e.g. {"r_eval": 4} or "r_eval=4,kv_strategy=last") on `tasks`.

    Returns {"model_dir", "model_args" (dict), "model_args_str" (for `lm_eval --model_args`),
    "r_eval" (model_args' r_eval or None), "tasks": {task: {"acc": .., "acc_stderr": .., "acc_norm": ..,
    ..., "n": docs scored, "version": ..}}, settings, and with log_samples "samples": {task: [lm-eval's
    per-doc records]}}. Metric keys drop lm-eval's ",none" filter suffix (other filters keep it).
    batch_size=1 (default) reproduces own_accuracy bitwise; larger is faster but rounds differently."""
    import lm_eval  # lm-eval (seconds to import) only for `rgpt eval lm-eval`

    model_args = hf_model_args(hf_dir, model_args_extra, remote_code)
    task_names = _task_list(tasks)
    tm = task_manager if task_manager is not None else make_task_manager(task_names, include_path)
    out = lm_eval.simple_evaluate(
        model="hf", model_args=model_args, tasks=task_names, task_manager=tm, batch_size=batch_size,
        device=device, limit=limit, num_fewshot=num_fewshot, log_samples=log_samples,
        bootstrap_iters=bootstrap_iters)
    if out is None:  # a non-zero rank under a distributed launcher
        return {}
    per_task = {}
    for name, raw in out["results"].items():
        per_task[name] = metrics_from_lm_eval(raw)
        n = out.get("n-samples", {}).get(name, {}).get("effective")
        if n is not None:
            per_task[name]["n"] = n
        if name in out.get("versions", {}):
            per_task[name]["version"] = out["versions"][name]
    result = {
        "model_dir": model_args["pretrained"],
        "model_args": model_args,
        "model_args_str": model_args_string(model_args),
        "r_eval": model_args.get("r_eval"),
        "tasks": per_task,
        "num_fewshot": {k: v for k, v in out.get("n-shot", {}).items()},
        "limit": limit,
        "batch_size": batch_size,
        "device": device,
        "lm_eval_version": getattr(lm_eval, "__version__", None),
    }
    if log_samples:
        result["samples"] = out.get("samples", {})
    return result


def metrics_from_lm_eval(raw: Mapping[str, Any]) -> dict[str, Any]:
    """lm-eval's {"acc,none": .., "acc_stderr,none": .., "alias": .., "sample_len": ..} as
    {"acc": .., "acc_stderr": .., "n": ..}."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("alias", "name"):
            continue
        if key == "sample_len":
            out["n"] = value
            continue
        metric, _, filt = key.partition(",")
        out[metric if filt in ("", "none") else key] = value
    return out


def model_config(hf_dir: str | Path) -> dict[str, Any]:
    path = Path(hf_dir).expanduser() / "config.json"
    if not path.is_file():
        raise HarnessError(f"{Path(hf_dir)} is not a Hugging Face model directory (no config.json)")
    return json.loads(path.read_text())


def depth_sweep(hf_dir: str | Path, tasks: str | Sequence[str] = (EXAMPLE_TASK,),
                depths: Iterable[int] = (), **kwargs) -> list[dict[str, Any]]:
    """`run_lm_eval` once per inference depth R* in `depths`, passing `r_eval=R*` in model_args (the
    RecurrentGPT export's from_pretrained override). Returns one result per depth, in order, each
    with "r_eval" set. `kwargs` go to run_lm_eval (model_args_extra may not set r_eval itself)."""
    depths = list(depths)
    if not depths:
        raise HarnessError("depth_sweep needs at least one depth")
    for d in depths:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise HarnessError(f"depths must be integers >= 0 (R* = 0 is the prelude/coda only), got {d!r}")
    cfg = model_config(hf_dir)
    if "r_eval" not in cfg:
        raise HarnessError(
            f"{hf_dir}: model_type {cfg.get('model_type')!r} has no `r_eval` in its config.json, so it has "
            f"no inference recurrence depth to sweep: depth_sweep needs a RecurrentGPT export "
            f"(trust_remote_code, config with r_eval); evaluate a dense model once with run_lm_eval")
    extra = parse_model_args(kwargs.pop("model_args_extra", None))
    if "r_eval" in extra:
        raise HarnessError("depth_sweep sets r_eval itself: remove it from model_args_extra")
    task_names = _task_list(tasks)
    tm = kwargs.pop("task_manager", None) or make_task_manager(task_names, kwargs.get("include_path"))
    results = []
    for d in depths:
        results.append(run_lm_eval(hf_dir, task_names, model_args_extra={**extra, "r_eval": d},
                                   task_manager=tm, **kwargs))
    return results


# ------------------------------------------------------------------------------------ reporting

def result_rows(results: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per task x depth: model_dir, r_eval, task, n, then the metrics."""
    runs = [results] if isinstance(results, Mapping) else list(results)
    rows = []
    for run in runs:
        for task, metrics in run.get("tasks", {}).items():
            row = {"model_dir": run.get("model_dir"), "r_eval": run.get("r_eval"), "task": task,
                   "n": metrics.get("n")}
            row.update({k: v for k, v in metrics.items() if k != "n"})
            rows.append(row)
    return rows


def write_results(results: Mapping[str, Any] | Sequence[Mapping[str, Any]], out_dir: str | Path) -> dict[str, Path]:
    """Writes OUT/lm_eval_results.json (every run with its settings; per-doc samples, when logged, go
    to OUT/samples_<task>[_r<R*>].jsonl instead) and OUT/lm_eval_results.csv (result_rows). Returns
    {"json": path, "csv": path, "samples": [paths]}."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [dict(results)] if isinstance(results, Mapping) else [dict(r) for r in results]
    sample_paths = []
    for run in runs:
        samples = run.pop("samples", None) or {}
        for task, records in samples.items():
            suffix = "" if run.get("r_eval") is None else f"_r{run['r_eval']}"
            path = out_dir / f"samples_{_safe(task)}{suffix}.jsonl"
            with open(path, "w") as f:
                for rec in records:
                    f.write(strict_json.dumps(rec, default=_jsonable) + "\n")
            sample_paths.append(path)
    json_path = out_dir / RESULTS_JSON
    json_path.write_text(strict_json.dumps({"runs": runs}, indent=2, default=_jsonable) + "\n")  # NaN -> null
    rows = result_rows(runs)
    lead = ["model_dir", "r_eval", "task", "n"]
    metric_cols = sorted({k for r in rows for k in r} - set(lead),
                         key=lambda k: (k.replace("_stderr", ""), "_stderr" in k))
    csv_path = out_dir / RESULTS_CSV
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=lead + metric_cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in lead + metric_cols})
    return {"json": json_path, "csv": csv_path, "samples": sample_paths}


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _jsonable(obj):
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    return str(obj)
