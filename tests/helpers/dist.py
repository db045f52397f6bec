"""Run code on N local processes under torchrun (gloo on CPU), as users launch it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def torchrun(module: str, nproc: int, *args: str, timeout: float = 300, env: dict | None = None) -> str:
    """`torchrun --standalone --nproc_per_node nproc -m module args`; returns stdout, raises with
    the combined output on failure."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", module, *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
                # DeepSpeed compiles its CPU communication op once; keep it with the environment
                "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".venv" / "torch_extensions")),
                **(env or {})}
    done = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"torchrun {module} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout
