"""Short real training runs for tests: a tiny prepared dataset and the launcher under torchrun."""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.dist import ROOT, torchrun

# family-independent shrinking, then the quickstart RecurrentGPT's depth settings
BASE = ["train.seq_len=32", "train.micro_batch_size=2", "train.global_batch_size=8", "train.warmup_steps=2",
        "train.lr=3e-3", "parallel.dtype=fp32", "parallel.activation_checkpointing=recurrence", "log.every_steps=1",
        "log.wandb=disabled"]
COMMON = ["model.n_loops=4", "model.r_min=1", *BASE]


def prepare_dataset(out: Path) -> Path:
    """The project's own source tokenized at seq_len 32 (30% validation)."""
    from data_prep.cli import main as prep
    assert prep([str(ROOT / "rgpt_dist"), "--out", str(out), "--seq-len", "32", "--val-fraction", "0.3"]) == 0
    return out


QUICKSTART = "configs/experiments/quickstart.yaml"


def train(nproc, run_dir, dataset, *overrides, timeout=600, env=None, common=COMMON, config=QUICKSTART):
    """`config` (the quickstart's RecurrentGPT) shrunk by `common` (another looped family: `BASE` and
    `model=FLAVOUR` among the overrides; a dense model: a config without RecurrentGPT fields such as
    configs/experiments/gpt2-small-20k.yaml), then `overrides`; returns the metrics records."""
    torchrun("launcher.train", nproc, config, *common, f"data.paths=[{dataset}]", f"log.run_dir={run_dir}",
             *overrides, timeout=timeout, env=env)
    return records(run_dir)


def records(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def losses(recs):
    return [(r["step"], r["loss"]) for r in recs if "loss" in r]
