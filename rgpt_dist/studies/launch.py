"""CPU presets and the launch of a study's runs: each run's commands in one process from the
checkout (grid configs are named relative to it); a language model's through torchrun and
`-m launcher.train` (the module, never a script path). No torch import."""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rgpt_dist.models.spec import spec_for
from rgpt_dist.progress import bar
from rgpt_dist.sections import literal_override

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: configs/experiments/ and the launcher package."""
PRESETS: dict[str, dict[str, Any]] = {
    # about 13 min on 2 cores (2026-12-01: 11 min 24 s for five models, MoR 86 s), half of it Ouro's ten
    # readouts through the 50,257-row head
    "cpu": {"d_model": 64, "n_head": 4, "seq_len": 128, "micro_batch_size": 8, "global_batch_size": 16,
            "max_steps": 100, "warmup_steps": 10, "lr": 2e-3, "min_lr": 2e-4, "eval_batches": 4},
    # issue #29: about 10x "cpu"'s tokens (500 steps of 32 x 128 = 2,048,000 per run) at twice the width,
    # every model at both seeds, checkpoints every 50 steps, in the paper's bf16 autocast (1.2x fp32's
    # speed on an avx512_bf16 CPU): about 4.5 hours on 2 cores (results/compare-long), finished runs kept
    # across machines (rgpt_dist.studies.records)
    "long": {"d_model": 128, "n_head": 4, "seq_len": 128, "micro_batch_size": 8, "global_batch_size": 32,
             "max_steps": 500, "warmup_steps": 50, "lr": 2e-3, "min_lr": 2e-4, "eval_batches": 16,
             "checkpoint_every": 50, "eval_every": 100, "every_seed": True, "dtype": "bf16-autocast"},
    # a smoke run of the whole flow (tests)
    "quick": {"d_model": 32, "n_head": 2, "seq_len": 32, "micro_batch_size": 2, "global_batch_size": 4,
              "max_steps": 2, "warmup_steps": 1, "lr": 2e-3, "min_lr": 2e-4, "eval_batches": 1},
}


def cpu_overrides(preset: str, family: str, seed: int, data: str, run_dir: str | Path) -> list[str]:
    """A grid config shrunk to a CPU preset: width, batch, steps, schedule, 2-process ZeRO-2 in fp32
    (or the preset's dtype),
    a checkpoint and an evaluation at the end (and every `checkpoint_every` / `eval_every` steps where
    the preset says: a killed long run resumes from its last one); RRT's LoRA rank keeps its ratio to
    the width."""
    p = PRESETS[preset]
    spec = spec_for(family)
    width = [f"model.{k}={v}" for k, v in spec.width_overrides(p["d_model"]).items()]  # RRT's LoRA rank
    return [*width, f"model.d_model={p['d_model']}", f"model.n_head={p['n_head']}", f"model.block_size={p['seq_len']}",
            f"train.seq_len={p['seq_len']}", f"train.micro_batch_size={p['micro_batch_size']}",
            f"train.global_batch_size={p['global_batch_size']}", f"train.max_steps={p['max_steps']}",
            f"train.warmup_steps={p['warmup_steps']}", f"train.lr={p['lr']}", f"train.min_lr={p['min_lr']}",
            f"train.seed={seed}", literal_override("data.paths", [str(data)]), "parallel.zero_stage=2", f"parallel.dtype={p.get('dtype', 'fp32')}",
            "parallel.activation_checkpointing=none", f"checkpoint.every_steps={p.get('checkpoint_every', p['max_steps'])}",
            "checkpoint.keep_last=1", f"eval.every_steps={p.get('eval_every', p['max_steps'])}",
            f"eval.batches={p['eval_batches']}",
            literal_override("log.run_dir", str(run_dir)), "log.every_steps=10", "log.wandb=disabled"]


def train_command(config: str, overrides: list[str], nproc: int) -> list[str]:
    """torchrun on nproc processes running the training launcher as a module."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "launcher.train", config, *overrides]


def run_all(runs: list, commands_of, jobs: int = 1, log_dir: str | Path | None = None,
            on_end=None) -> list[str]:
    """Runs each run's commands (commands_of(run): argv lists, in sequence, stopping at the first that
    fails) from the checkout, `jobs` runs at a time (the next starts as soon as any ends); prints one
    line per run as it ends, with a progress bar over the runs on a terminal, and calls on_end(run,
    wall_s, returncode); returns the names of those that failed, whose output's tail is printed (the
    others still run). Each run's output goes to log_dir/<name>.log (appended: a resumed run keeps its
    first launch's), or a temporary file."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    failed: list[str] = []
    pending, running = list(runs), []
    with bar(total=len(runs), desc="runs", unit="run") as progress, _stopping(running):
        while pending or running:
            while pending and len(running) < jobs:
                run = pending.pop(0)
                running.append((run, _start(run, commands_of(run), env, log_dir), time.perf_counter()))
            run, (proc, log), start = running.pop(_first_ended(running))
            with log:
                returncode = proc.returncode
                wall_s = time.perf_counter() - start
                status = "done" if returncode == 0 else f"FAILED ({returncode})"
                progress.write(f"{run.name}: {status} in {wall_s:.0f} s")
                progress.update(1)
                sys.stdout.flush()
                if on_end is not None:
                    on_end(run, wall_s, returncode)
                if returncode != 0:
                    failed.append(run.name)
                    log.seek(0)
                    print(log.read()[-3000:], file=sys.stderr)
    return failed


def _first_ended(running: list) -> int:
    """The index of a run whose process has ended, waiting for one: whichever ends first, so that a
    lane freed by a short run starts the next at once instead of waiting for an older, longer one
    (`make rlt`'s RLT-1 runs take three times its baselines')."""
    while True:
        for i, (_, (proc, _log), _) in enumerate(running):
            if proc.poll() is not None:
                return i
        time.sleep(0.1)


@contextlib.contextmanager
def _stopping(running: list):
    """On the way out through an exception (Ctrl-C; SIGTERM where the command turns it into SystemExit)
    every running run's process group is terminated: a run is its own session, so its torchrun and
    ranks go with it instead of training on unseen (each saves at the signal: the trainer's rules)."""
    try:
        yield
    except BaseException:
        for _, (proc, _log), _ in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for _, (proc, _log), _ in running:
            proc.wait()
        raise


def _start(run, commands: list[list[str]], env: dict[str, str], log_dir):
    """One process for the run: its commands joined by && in a shell (each word quoted), its output
    to a file (a full pipe would block the run)."""
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        log = open(Path(log_dir) / f"{run.name}.log", "a+", encoding="utf-8")
    else:
        log = tempfile.TemporaryFile("w+")
    script = " && ".join(shlex.join(cmd) for cmd in commands)
    proc = subprocess.Popen(["/bin/sh", "-c", script], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    return proc, log
