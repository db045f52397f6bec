"""The real trainer on one H200 in one command: DeepSpeed ZeRO-1, bf16, NCCL, streaming data, checkpoints.

    # the remote run (the `run` tool, carry [".whl"], timeout_s 570; .whl/ from benchmarks/device_wheels.sh):
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site || exit; \
        OUT=$OUT PYTHONUNBUFFERED=1 python3 benchmarks/gpu_trainer.py --budget-s 480 --vocab .whl/gpt2.tiktoken
    .venv/bin/python benchmarks/gpu_trainer.py --quick      # CPU smoke run: gloo, debug flavours, aot_eager

Where benchmarks/gpu_suite.py times bare models, this runs `launcher/train.py` (load_config, preflight,
rgpt_dist.train.run.train: DeepSpeed engine, parallel.compile, activation checkpointing, the streaming
loader, CheckpointManager, metrics.jsonl) under `torchrun --standalone --nproc_per_node 1`, one fresh
process per arm, so that each arm's peak memory, compilation and failure are its own.
Steps, in order (all in $OUT/gpu_trainer.json, or --out DIR; OUT defaults to ./gpu_out):
  environment  torch/CUDA, device, versions of the carried packages, and whether each imports
  data         `python -m data_prep.cli python-stdlib` (rgpt-prep, like `make quickstart`) tokenizes the
               device python's standard library at seq_len 1024 (the vocabulary: --vocab, RGPT_GPT2_VOCAB,
               ~/.cache/rgpt-dist or .whl/gpt2.tiktoken; falls back to torch's own sources)
  arms         gpt2-medium and recurrentgpt-medium-isoflops (2+5x4+2, r ~ U{1..4} per step as it
               trains) x parallel.compile none / blocks (inductor) x activation checkpointing none /
               recurrence; ZeRO-1, bf16, micro-batch 8, seq 1024, 2 micro-batches per optimizer step;
               5 warm-up steps then 20 timed ones, logged every step. Reported from the trainer's own
               metrics.jsonl over the timed steps: tokens/s, MFU and HFU (time-weighted), median step
               ms, mean r; the first step's seconds (compilation included); compiled_frames and
               graph_breaks, and frames compiled during the timed steps (0 = r changing every step
               recompiles nothing); peak GPU memory allocated / reserved of the whole process.
  checkpoint   the first arm saves its last step (DeepSpeed files + checksums, timed, size on disk);
               a second launch in the same run directory resumes from it (verify + restricted unpickle
               + load, timed) and trains one more step. The other arms skip the final save (patched
               out in the worker only, to spend the budget on steps, not on 5 GB writes).
Budget: each arm starts only with enough time left (--budget-s, a static estimate per kind) and is
killed at its limit (a cap per kind, or the budget's end), its trainer's process group included, its
partial records kept; skipped arms say why. --fail-arm and --hang-arm (debug) prove that a refused or a
stuck launch costs only its own arm. With less device time left: --budget-s 300. The JSON is rewritten
after every step; the markdown summary goes to $OUT/gpu_trainer.md and stdout, and every launch's
output to $OUT/gpu_trainer.log. Afterwards: paste the markdown into docs/performance.md (section
"GPU suite on the real trainer (issue #13)"), noting skips and errors.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = {  # models, batch shape, steps, per-launch start estimate and limit (s), data-prep workers
    "full": dict(dense="gpt2-medium", recurrent="recurrentgpt-medium-isoflops", seq=1024, micro=8, accum=2,
                 warmup=5, steps=20, backend="inductor", need={"none": 45.0, "blocks": 90.0, "resume": 60.0},
                 cap={"none": 180.0, "blocks": 300.0, "resume": 150.0}, workers=8),
    "quick": dict(dense="gpt2-debug", recurrent="recurrentgpt-debug", seq=32, micro=2, accum=2,
                  warmup=1, steps=2, backend="aot_eager", need={"none": 5.0, "blocks": 5.0, "resume": 5.0},
                  cap={"none": 180.0, "blocks": 240.0, "resume": 180.0}, workers=1),
}
# (model, parallel.compile, parallel.activation_checkpointing), in run order: the eager/no-AC pair first
# (the first arm also writes the checkpoint the resume launch reads), compile next, then checkpointing.
ARMS = [("dense", "none", "none"), ("recurrent", "none", "none"), ("dense", "blocks", "none"),
        ("recurrent", "blocks", "none"), ("dense", "none", "recurrence"), ("recurrent", "none", "recurrence"),
        ("dense", "blocks", "recurrence"), ("recurrent", "blocks", "recurrence")]
RESUME = "resume"
CHECKPOINT_ARM = "dense/compile=none/ac=none"
PACKAGES = ("torch", "deepspeed", "megatron-core", "mosaicml-streaming", "pydantic", "pydantic-core", "zstandard",
            "tiktoken", "triton", "numpy", "transformers", "typing-extensions")
IMPORTS = ("deepspeed", "megatron.core", "streaming", "zstandard", "tiktoken", "pydantic")
RESERVE_S = 10.0  # kept for the summary at the end
HANG_LIMIT_S = 8.0  # the limit of a --hang-arm launch (its worker writes its pid before any import)
MB = 2 ** 20


def arm_name(kind: str, compile_mode: str, ac: str) -> str:
    return f"{kind}/compile={compile_mode}/ac={ac}"


# ---- the worker: one trainer process under torchrun --------------------------------------------------

def worker(argv: list[str]) -> int:
    """`gpu_trainer.py --worker RESULT.json [--no-save] CONFIG OVERRIDES...` under torchrun: the launcher's
    main() with CheckpointManager.save/load timed (or the save skipped), then peak memory into RESULT."""
    result_path, rest = Path(argv[0]), argv[1:]
    no_save = bool(rest) and rest[0] == "--no-save"
    rest = rest[1:] if no_save else rest
    # torchrun starts each worker in a session of its own: the controller kills that group at the limit
    result_path.with_suffix(".pid").write_text(str(os.getpid()))
    if os.environ.get("GPU_TRAINER_HANG"):  # debug (--hang-arm): proves the limit ends a stuck launch
        time.sleep(10 ** 6)
    import torch

    from launcher.train import main as launch
    from rgpt_dist.train.checkpoint import CheckpointManager

    info = {"save_s": [], "load_s": [], "loaded": None, "saves_skipped": 0}
    save, load = CheckpointManager.save, CheckpointManager.load

    def timed_save(self, engine, step, client_state, **kwargs):  # kwargs: best= (checkpoint.keep_best)
        if no_save:  # the benchmark's other arms: no 5 GB write at the last step
            info["saves_skipped"] += 1
            return self.dir / f"step_{step:08d}"
        t = time.perf_counter()
        out = save(self, engine, step, client_state, **kwargs)
        info["save_s"].append(time.perf_counter() - t)
        return out

    def timed_load(self, engine, tag, **kwargs):  # kwargs: universal= (a checkpoint of another layout)
        t = time.perf_counter()
        out = load(self, engine, tag, **kwargs)
        info["load_s"].append(time.perf_counter() - t)
        info["loaded"] = tag
        return out

    CheckpointManager.save, CheckpointManager.load = timed_save, timed_load
    cuda = torch.cuda.is_available()
    t = time.perf_counter()
    rc = launch(rest)
    info.update(rc=rc, train_s=time.perf_counter() - t, max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                peak_allocated_mb=torch.cuda.max_memory_allocated() / MB if cuda else None,
                peak_reserved_mb=torch.cuda.max_memory_reserved() / MB if cuda else None)
    if int(os.environ.get("RANK", 0)) == 0:
        result_path.write_text(json.dumps(info))
    return rc


# ---- the controller ---------------------------------------------------------------------------------

class Run:
    def __init__(self, args):
        self.args, self.size = args, SIZES["quick" if args.quick else "full"]
        self.start = time.monotonic()
        self.deadline = self.start + args.budget_s
        self.out = Path(args.out or os.environ.get("OUT") or "gpu_out")
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gpu_trainer_"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = self.out / "gpu_trainer.log"
        self.log.write_text("")
        self.report = {"meta": {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                                "argv": sys.argv[1:], "quick": args.quick, "budget_s": args.budget_s,
                                "sizes": self.size, "workdir": str(self.work), "finished": False},
                       "environment": {}, "data": {}, "arms": {}, "checkpoint": {}}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def say(self, text: str) -> None:
        print(f"[gpu_trainer {self.elapsed():6.1f} s] {text}", flush=True)

    def save_json(self) -> None:
        from gpu_suite import write_json
        self.report["meta"]["elapsed_s"] = self.elapsed()
        write_json(self.report, self.out / "gpu_trainer.json")

    def env(self) -> dict:
        """For every child: this checkout first on the path (the carried packages stay after it), no wandb."""
        path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {**os.environ, "PYTHONPATH": path, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
        if self.args.quick:
            env.setdefault("OMP_NUM_THREADS", "1")
        # DeepSpeed's CPU comm op (CPU only), compiled once into the project venv's cache: only that venv's
        # python may use it (another python rebuilds it in place, and the venv's next launch rebuilds it back)
        ext = ROOT / ".venv" / "torch_extensions"
        if ext.is_dir() and Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():
            env.setdefault("TORCH_EXTENSIONS_DIR", str(ext))
        return env

    def launch(self, cmd: list[str], timeout: float, label: str, pid_file: Path | None = None,
               env: dict | None = None) -> tuple[int | None, str, float]:
        """(exit status or None when killed at its limit, output, seconds). At the limit the trainer's
        process group (its pid in pid_file: torchrun gives each worker a session of its own, GPU memory and
        compile workers included) is killed, then the launcher's."""
        t = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**self.env(), **(env or {})}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=max(timeout, 1.0))
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            groups = [int(pid_file.read_text())] if pid_file and pid_file.is_file() else []
            for group in [*groups, proc.pid]:
                try:
                    os.killpg(group, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            output, _ = proc.communicate()
            rc = None
        seconds = time.monotonic() - t
        with open(self.log, "a") as f:
            f.write(f"\n===== {label}: rc {rc}, {seconds:.1f} s: {' '.join(cmd)}\n{output}")
        return rc, output, seconds


def first_line(e: BaseException) -> str:
    from gpu_suite import first_line as fl
    return fl(e)


def environment(run: Run) -> dict:
    import torch

    res = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "python": sys.version.split()[0],
           "cpu_count": os.cpu_count(), "cuda_available": torch.cuda.is_available(), "versions": {}, "imports": {}}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        res.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                   memory_gib=props.total_memory / 2**30, gpus=torch.cuda.device_count())
    for name in PACKAGES:
        try:
            res["versions"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            res["versions"][name] = None
    if not torch.cuda.is_available():  # as rgpt_dist.parallel.deepspeed_lib does, before deepspeed is imported
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for module in IMPORTS:
        try:
            with warnings.catch_warnings():  # megatron's "Transformer Engine and Apex are not installed", x4
                warnings.simplefilter("ignore")
                if module == "streaming":
                    from rgpt_dist.data.mds import import_streaming
                    import_streaming()
                else:
                    importlib.import_module(module)
            res["imports"][module] = "ok"
        except Exception as e:  # a missing carried wheel shows up here first, by name
            res["imports"][module] = first_line(e)
    from rgpt_dist.train.metrics import peak_flops
    res["peak_flops"], res["peak_source"] = peak_flops("bf16")
    return res


def find_vocab(run: Run) -> str | None:
    from rgpt_dist.data.tokenizer import find_vocab as find
    for candidate in (run.args.vocab, os.environ.get("RGPT_GPT2_VOCAB"), None, str(ROOT / ".whl" / "gpt2.tiktoken")):
        try:
            found = find(candidate) if candidate is None or Path(candidate).is_file() else None
        except Exception:  # a wrong file: try the next
            found = None
        if found:
            return str(Path(found).resolve())
    return None


def prepare_data(run: Run) -> dict:
    """rgpt-prep (the CLI module) over --source, then torch's own sources if that gives nothing."""
    import torch

    vocab = find_vocab(run)
    res = {"vocab": vocab, "seq_len": run.size["seq"], "attempts": []}
    if vocab is None:
        raise RuntimeError("no verified gpt2.tiktoken: pass --vocab (benchmarks/device_wheels.sh copies it to "
                           ".whl/gpt2.tiktoken) or run `rgpt-prep --fetch-vocab` where PyPI is reachable")
    out = run.work / "data"
    for source in (run.args.source, str(Path(torch.__file__).parent)):
        cmd = [sys.executable, "-m", "data_prep.cli", source, "--out", str(out), "--seq-len", str(run.size["seq"]),
               "--workers", str(run.size["workers"]), "--vocab", vocab, "--overwrite", "--no-progress"]
        rc, output, seconds = run.launch(cmd, min(run.left(), 240.0), f"rgpt-prep {source}")
        res["attempts"].append({"source": source, "rc": rc, "seconds": seconds,
                                **({} if rc == 0 else {"tail": output[-1500:]})})
        if rc == 0:
            manifest = json.loads((out / "manifest.json").read_text())
            splits = {k: {f: v.get(f) for f in ("documents", "samples", "tokens")} for k, v in manifest["splits"].items()}
            res.update(path=str(out), source=source, seconds=seconds, splits=splits,
                       skipped=manifest.get("skipped", {}).get("counts"), warnings=manifest.get("warnings", {}).get("counts"))
            return res
    raise RuntimeError(f"rgpt-prep failed on every source (see {run.log.name})")


def overrides(run: Run, kind: str, compile_mode: str, ac: str, run_dir: Path, max_steps: int) -> list[str]:
    s = run.size
    return [s[kind], f"train.seq_len={s['seq']}", f"train.micro_batch_size={s['micro']}",
            f"train.global_batch_size={s['micro'] * s['accum']}", f"train.max_steps={max_steps}",
            f"train.warmup_steps={s['warmup']}", "train.seed=1337",
            f"data.paths=[{run.report['data']['path']}]", "parallel.zero_stage=1", "parallel.dtype=bf16",
            f"parallel.activation_checkpointing={ac}", f"parallel.compile={compile_mode}",
            f"parallel.compile_backend={run.args.compile_backend}", "checkpoint.every_steps=1000000",
            "checkpoint.keep_last=1", "eval.every_steps=0", f"log.run_dir={run_dir}", "log.every_steps=1",
            "log.wandb=disabled"]


def read_records(run_dir: Path) -> list[dict]:
    from rgpt_dist.train.metrics import read_metrics
    return [r for _, r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]


def summarise(records: list[dict], warmup: int, tokens_per_step: int) -> dict:
    """The timed steps (after `warmup`) of a run's metrics records, each logged alone: aggregate tokens/s
    and time-weighted MFU/HFU, median step; compile counters at the warm-up's end and the last step."""
    out: dict = {"steps_logged": len(records)}
    if not records:
        return out
    secs = {r["step"]: tokens_per_step / r["tokens_per_s"] for r in records if r.get("tokens_per_s")}
    out.update(first_step_s=secs.get(1), loss_first=records[0]["loss"], loss_last=records[-1]["loss"],
               skipped_steps=sum(bool(r.get("skipped")) for r in records))
    if "compiled_frames" in records[-1]:
        at_warmup = [r for r in records if r["step"] <= warmup]
        out.update(compiled_frames=records[-1]["compiled_frames"], graph_breaks=records[-1]["graph_breaks"],
                   frames_compiled_in_timed_steps=(records[-1]["compiled_frames"] - at_warmup[-1]["compiled_frames"])
                   if at_warmup else None)
    timed = [r for r in records if r["step"] > warmup and r["step"] in secs]
    if not timed:
        return out
    total = sum(secs[r["step"]] for r in timed)
    depths = [r["r"] for r in timed if r.get("r") is not None]
    out.update(timed_steps=len(timed), tokens_per_s=len(timed) * tokens_per_step / total,
               mfu=sum(r["mfu"] * secs[r["step"]] for r in timed) / total,
               hfu=sum(r["hfu"] * secs[r["step"]] for r in timed) / total,
               step_ms_median=1e3 * statistics.median(secs[r["step"]] for r in timed),
               mean_r=statistics.mean(depths) if depths else None, depths=depths or None)
    return out


def run_arm(run: Run, kind: str, compile_mode: str, ac: str, name: str, resume_of: Path | None = None) -> dict:
    """One torchrun launch of the trainer; `resume_of`: the run directory to resume (one more step)."""
    s = run.size
    need, cap = (s["need"][RESUME], s["cap"][RESUME]) if resume_of else (s["need"][compile_mode], s["cap"][compile_mode])
    entry = run.report["checkpoint"] if resume_of else run.report["arms"].setdefault(name, {})
    entry.update(status="running", model=s[kind], compile=compile_mode, ac=ac)
    bad = [m for m, v in run.report["environment"].get("imports", {}).items() if v != "ok" and m != "megatron.core"]
    if run.left() - RESERVE_S < need:
        entry.update(status="skipped", reason=f"budget: {run.left():.0f} s left, this launch needs ~{need:.0f} s")
    elif bad:
        entry.update(status="skipped", reason=f"not importable: {', '.join(bad)} (carry .whl: benchmarks/device_wheels.sh)")
    elif not run.report["data"].get("path"):
        entry.update(status="skipped", reason=run.report["meta"].get("note") or "no dataset (see data)")
    if entry["status"] == "skipped":
        return entry
    run_dir = resume_of or run.work / "runs" / name.replace("/", "_").replace("=", "-")
    max_steps = s["warmup"] + s["steps"] + (1 if resume_of else 0)
    result = run.work / f"result_{len(run.report['arms'])}_{'resume' if resume_of else 'arm'}.json"
    result.unlink(missing_ok=True)
    result.with_suffix(".pid").unlink(missing_ok=True)
    save = name == CHECKPOINT_ARM and not resume_of
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(Path(__file__).resolve()),
           "--worker", str(result), *([] if save else ["--no-save"]),
           *overrides(run, kind, compile_mode, ac, run_dir, max_steps)]
    if run.args.fail_arm == name:  # debug: a config the launcher refuses (exit 2), to prove the next arm runs
        cmd.append("train.max_steps=0")
    hang = run.args.hang_arm == name and not resume_of
    limit = HANG_LIMIT_S if hang else min(cap, run.left() - RESERVE_S)
    run.say(f"{'resume of ' + name if resume_of else name} (limit {limit:.0f} s) ...")
    rc, output, seconds = run.launch(cmd, limit, RESUME if resume_of else name, pid_file=result.with_suffix(".pid"),
                                     env={"GPU_TRAINER_HANG": "1"} if hang else None)
    entry["worker_pid"] = int(result.with_suffix(".pid").read_text()) if result.with_suffix(".pid").is_file() else None
    worker_info = json.loads(result.read_text()) if result.is_file() else {}
    records = read_records(run_dir) if run_dir.is_dir() else []
    entry.update(rc=rc, wall_s=seconds, **{k: worker_info.get(k) for k in ("peak_allocated_mb", "peak_reserved_mb",
                                                                           "max_rss_mb", "train_s")})
    if resume_of:
        resumed = [r for r in records if r["step"] == max_steps]
        entry.update(loaded=worker_info.get("loaded"), load_s=(worker_info.get("load_s") or [None])[0],
                     resumed_line=f"at step {max_steps - 1}" in output and "resumed from" in output,
                     step_after_resume=resumed[0]["step"] if resumed else None,
                     loss_after_resume=resumed[0]["loss"] if resumed else None)
        ok = rc == 0 and entry["loaded"] and resumed
    else:
        entry.update(summarise(records, s["warmup"], s["seq"] * s["micro"] * s["accum"]))
        if save:
            ckpt = run_dir / "checkpoints"
            run.report["checkpoint"].update(
                saved_by=name, save_s=(worker_info.get("save_s") or [None])[0],
                size_mb=sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file()) / MB if ckpt.is_dir() else None,
                tags=sorted(p.name for p in ckpt.glob("step_*")) if ckpt.is_dir() else [])
        ok = rc == 0 and entry.get("timed_steps")
    entry["status"] = "ok" if ok else ("timeout" if rc is None else "error")
    if not ok:
        entry["tail"] = output[-3000:]
    return entry


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2:])
    args = parse_args()
    try:
        import torch  # noqa: F401
    except ImportError as exc:  # nothing to run, but leave a record
        out = Path(args.out or os.environ.get("OUT") or "gpu_out")
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_trainer.json").write_text(json.dumps({"meta": {"error": f"torch is not importable: {exc}"}}))
        sys.exit(f"gpu_trainer: torch is not importable ({exc})")
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_suite's helpers
    run = Run(args)
    prepare(run)
    run_arms(run, set(args.arms.split(",")) if args.arms else None)
    run.report["meta"]["finished"] = True
    run.save_json()
    text = summary(run.report)
    (run.out / "gpu_trainer.md").write_text(text + "\n")
    print(text, flush=True)
    print(f"\nJSON: {run.out / 'gpu_trainer.json'}", flush=True)
    if not args.keep and not args.workdir:
        shutil.rmtree(run.work, ignore_errors=True)
    return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget of the whole run (default 480)")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: debug flavours, gloo, aot_eager, 3 steps")
    p.add_argument("--out", default=None, help="where the JSON, markdown and log go (default $OUT, else ./gpu_out)")
    p.add_argument("--arms", default=None, help="comma-separated arm names (model/compile=X/ac=Y) or 'resume'; default all")
    p.add_argument("--source", default="python-stdlib", help="rgpt-prep input (default python-stdlib)")
    p.add_argument("--vocab", default=None, help="gpt2.tiktoken (else RGPT_GPT2_VOCAB, the cache, .whl/gpt2.tiktoken)")
    p.add_argument("--compile-backend", default=None, help="parallel.compile_backend (default inductor; aot_eager with --quick)")
    p.add_argument("--workdir", default=None, help="data and run directories (default: a new temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (default: removed at the end)")
    p.add_argument("--fail-arm", default=None, help="debug: launch this arm with a config the launcher refuses")
    p.add_argument("--hang-arm", default=None, help=f"debug: this arm's trainer sleeps; killed after {HANG_LIMIT_S:.0f} s")
    args = p.parse_args()
    args.compile_backend = args.compile_backend or SIZES["quick" if args.quick else "full"]["backend"]
    return args


def prepare(run: Run) -> None:
    """The environment record and the prepared dataset, each step recorded even when it fails."""
    rep = run.report
    for step, fn in (("environment", environment), ("data", prepare_data)):
        run.say(f"{step} ...")
        if step == "data" and not run.args.quick and not rep["environment"].get("cuda_available"):
            rep["meta"]["note"] = "CUDA is not available: nothing to measure (use --quick for the CPU smoke run)"
            rep[step] = {"status": "skipped", "reason": rep["meta"]["note"]}
            continue
        if run.left() - RESERVE_S < 1.0:
            rep[step] = {"status": "skipped", "reason": f"budget: {run.left():.0f} s left"}
            continue
        try:
            rep[step] = {"status": "ok", **fn(run)}
        except Exception as e:
            rep[step] = {**rep[step], "status": "error", "error": first_line(e), "traceback": traceback.format_exc()[-2000:]}
        run.save_json()


def run_arms(run: Run, chosen: set[str] | None) -> None:
    """Every arm of ARMS (or the chosen ones), and the resume of CHECKPOINT_ARM's checkpoint; an arm's
    failure is recorded and costs that arm only."""
    rep = run.report
    for kind, compile_mode, ac in ARMS:
        name = arm_name(kind, compile_mode, ac)
        if chosen is not None and name not in chosen:
            continue
        try:
            run_arm(run, kind, compile_mode, ac, name)
        except Exception as e:  # a bug here costs this arm only
            rep["arms"][name].update(status="error", error=first_line(e), traceback=traceback.format_exc()[-2000:])
        run.save_json()
        if name == CHECKPOINT_ARM and (chosen is None or RESUME in chosen):
            run_dir = run.work / "runs" / name.replace("/", "_").replace("=", "-")
            if rep["arms"][name].get("status") == "ok" and rep["checkpoint"].get("tags"):
                try:
                    run_arm(run, kind, compile_mode, ac, name, resume_of=run_dir)
                except Exception as e:
                    rep["checkpoint"].update(status="error", error=first_line(e))
            else:
                rep["checkpoint"].update(status="skipped", reason=f"{name} wrote no checkpoint")
            run.save_json()
        if not run.args.keep:  # a medium checkpoint is ~5 GB: free the disk as we go
            shutil.rmtree(run.work / "runs", ignore_errors=True)


def summary(rep: dict) -> str:
    """The markdown to paste into docs/performance.md."""
    from gpu_suite import fmt, table

    env, data, ck = rep["environment"], rep["data"], rep["checkpoint"]
    v = env.get("versions", {})
    out = [f"## Trainer on {env.get('device_name', 'CPU')} {rep['meta']['started'][:10]}: torch {env.get('torch')}, "
           f"CUDA {env.get('cuda_build')}, deepspeed {v.get('deepspeed')}, streaming {v.get('mosaicml-streaming')}; "
           f"ZeRO-1, bf16, 1 process; MFU peak {fmt(env.get('peak_flops'), '.3g')} FLOP/s ({env.get('peak_source')})", ""]
    s = rep["meta"]["sizes"]
    tokens = data.get("splits", {}).get("train", {}).get("tokens")
    out.append(f"micro-batch {s['micro']} x {s['accum']} accumulation, seq {s['seq']}, {s['warmup']} warm-up + "
               f"{s['steps']} timed steps; data: {data.get('source')} ({fmt(tokens, ',.0f')} train tokens, "
               f"{fmt(data.get('seconds'))} s to prepare)")
    if rep["meta"].get("note"):
        out.append(f"- {rep['meta']['note']}")
    out += [f"- {k}: **{e.get('status')}** {e.get('reason') or e.get('error', '')}" for k, e in
            (("environment", env), ("data", data)) if e.get("status") != "ok"]
    out += [f"- import {m}: {r}" for m, r in env.get("imports", {}).items() if r != "ok"]
    rows = []
    for name, a in rep["arms"].items():
        if a.get("status") != "ok" and not a.get("timed_steps"):
            rows.append([name, f"**{a.get('status')}** {a.get('reason', '')}".strip()] + [""] * 8)
            continue
        frames = "-" if a.get("compiled_frames") is None else \
            f"{a['compiled_frames']} / {a['graph_breaks']} / {a['frames_compiled_in_timed_steps']}"
        rows.append([name, a["status"], fmt(a.get("tokens_per_s"), ",.0f"), fmt(100 * a["mfu"]) + "%",
                     fmt(100 * a["hfu"]) + "%", fmt(a.get("step_ms_median")), fmt(a.get("mean_r"), ".2f"),
                     fmt(a.get("first_step_s")), fmt(a.get("peak_allocated_mb") and a["peak_allocated_mb"] / 1024, ".2f"),
                     frames])
    out += table(["arm", "status", "tokens/s", "MFU", "HFU", "step ms", "mean r", "first step s", "peak GB",
                  "frames / breaks / in timed"], rows)
    pairs = []
    for kind in ("dense", "recurrent"):
        for ac in ("none", "recurrence"):
            a, b = (rep["arms"].get(arm_name(kind, c, ac), {}) for c in ("none", "blocks"))
            if a.get("tokens_per_s") and b.get("tokens_per_s"):
                pairs.append(f"{kind}/ac={ac} {b['tokens_per_s'] / a['tokens_per_s']:.2f}x")
    if pairs:
        out += ["", "compile=blocks / none (tokens/s): " + ", ".join(pairs)]
    if ck:
        out += ["", f"checkpoint: **{ck.get('status', '-')}** {ck.get('reason', '')} saved {', '.join(ck.get('tags', []))}"
                    f" in {fmt(ck.get('save_s'))} s ({fmt(ck.get('size_mb') and ck['size_mb'] / 1024, '.2f')} GB), loaded "
                    f"{ck.get('loaded')} in {fmt(ck.get('load_s'))} s, then step {ck.get('step_after_resume')} "
                    f"loss {fmt(ck.get('loss_after_resume'), '.4f')}"]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
