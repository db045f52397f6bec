"""CPU presets and the launch of a study's runs: one torchrun per run, through `-m launcher.train`
(the module, never a script path), from the checkout (grid configs are named relative to it).
No torch import."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rgpt_dist.models.spec import spec_for

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: configs/experiments/ and the launcher package."""
PRESETS: dict[str, dict[str, Any]] = {
    # about 13 min on 2 cores (2026-12-01: 11 min 24 s for five models, MoR 86 s), half of it Ouro's ten
    # readouts through the 50,257-row head
    "cpu": {"d_model": 64, "n_head": 4, "seq_len": 128, "micro_batch_size": 8, "global_batch_size": 16,
            "max_steps": 100, "warmup_steps": 10, "lr": 2e-3, "min_lr": 2e-4, "eval_batches": 4},
    # issue #29: about 10x "cpu"'s tokens (500 steps of 32 x 128 = 2,048,000 per run) at twice the width,
    # every model at both seeds, checkpoints every 50 steps, in the paper's bf16 autocast (1.2x fp32's
    # speed on an avx512_bf16 CPU): about 7 hours on 2 cores, finished runs kept across machines
    # (rgpt_dist.studies.records)
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
            f"train.seed={seed}", f"data.paths=[{data}]", "parallel.zero_stage=2", f"parallel.dtype={p.get('dtype', 'fp32')}",
            "parallel.activation_checkpointing=none", f"checkpoint.every_steps={p.get('checkpoint_every', p['max_steps'])}",
            "checkpoint.keep_last=1", f"eval.every_steps={p.get('eval_every', p['max_steps'])}",
            f"eval.batches={p['eval_batches']}",
            f"log.run_dir={run_dir}", "log.every_steps=10", "log.wandb=disabled"]


def train_command(config: str, overrides: list[str], nproc: int) -> list[str]:
    """torchrun on nproc processes running the training launcher as a module."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "launcher.train", config, *overrides]


def train_runs(runs: list, args_of, nproc: int = 2, jobs: int = 1, on_end=None) -> list[str]:
    """Trains each run (`.name`, `.config` relative to the checkout) with the overrides args_of(run),
    `jobs` runs at a time (each on nproc processes); prints one line per run as it ends and calls
    on_end(run, wall_s, returncode); returns the names of those that failed, whose
    stderr's tail is printed (the others still run). A finished run is kept, an interrupted one
    resumes (the trainer's own rules)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    failed: list[str] = []
    pending, running = list(runs), []
    while pending or running:
        while pending and len(running) < jobs:
            run, err = pending.pop(0), tempfile.TemporaryFile("w+")  # a file: a full pipe would block the run
            proc = subprocess.Popen(train_command(run.config, args_of(run), nproc), cwd=ROOT, env=env,
                                    stdout=subprocess.DEVNULL, stderr=err, text=True)
            running.append((run, proc, err, time.perf_counter()))
        run, proc, err, start = running.pop(0)  # the oldest first: a study's runs are of similar length
        with err:
            proc.wait()
            wall_s = time.perf_counter() - start
            status = "done" if proc.returncode == 0 else f"FAILED ({proc.returncode})"
            print(f"{run.name}: {status} in {wall_s:.0f} s", flush=True)
            if on_end is not None:
                on_end(run, wall_s, proc.returncode)
            if proc.returncode != 0:
                failed.append(run.name)
                err.seek(0)
                print(err.read()[-3000:], file=sys.stderr)
    return failed
