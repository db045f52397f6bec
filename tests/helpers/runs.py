"""Short real training runs for tests: a tiny prepared dataset and the launcher on N ranks (tests.helpers.dist)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.corpus import CORPUS
from tests.helpers.dist import torchrun

# family-independent shrinking, then the quickstart RecurrentGPT's depth settings
BASE = ["train.seq_len=32", "train.micro_batch_size=2", "train.global_batch_size=8", "train.warmup_steps=2",
        "train.lr=3e-3", "parallel.dtype=fp32", "parallel.activation_checkpointing=recurrence", "log.every_steps=1",
        "log.wandb=disabled"]
COMMON = ["model.n_loops=4", "model.r_min=1", *BASE]
# data parallelism: noise off (the noise key holds the dp rank), evaluation of the same 16 validation
# samples: 2 ranks x 4 micro-batches of 2, or 1 rank x 8 (streaming's global order does not depend on
# the number of ranks); the one-process run is tests/train/conftest.py's `reference`
DP = ["model.sigma_x=0", "model.sigma_g=0", "train.max_steps=5", "eval.every_steps=5", "checkpoint.every_steps=5"]


def prepare_dataset(out: Path) -> Path:
    """The frozen corpus (the package's source at one commit, tests/helpers/corpus.py: edits of the
    package no longer change the tests' data) tokenized at seq_len 32 (30% validation). Tests share
    one per session: the `dataset` fixture of tests/conftest.py."""
    from data_prep.cli import main as prep
    assert prep([str(CORPUS), "--out", str(out), "--seq-len", "32", "--val-fraction", "0.3"]) == 0
    return out


QUICKSTART = "configs/experiments/quickstart.yaml"


def launch(nproc, run_dir, dataset, *overrides, timeout=600, env=None, common=COMMON, config=QUICKSTART) -> str:
    """As `train`, returning the ranks' stdout (rank 0's messages, e.g. where it resumed from)."""
    return torchrun("launcher.train", nproc, config, *common, f"data.paths=[{dataset}]", f"log.run_dir={run_dir}",
                    *overrides, timeout=timeout, env=env)


def train(nproc, run_dir, dataset, *overrides, timeout=600, env=None, common=COMMON, config=QUICKSTART,
          log_samples=False):
    """`config` (the quickstart's RecurrentGPT) shrunk by `common` (another looped family: `BASE` and
    `model=FLAVOUR` among the overrides; a dense model: a config without RecurrentGPT fields such as
    configs/experiments/gpt2-small-20k.yaml), then `overrides`; returns the metrics records.
    log_samples: the run logs its samples into RUN_DIR/samples (RGPT_SAMPLE_LOG), what
    tests.helpers.replay reads."""
    if log_samples:
        env = {**(env or {}), "RGPT_SAMPLE_LOG": str(Path(run_dir) / "samples")}
    launch(nproc, run_dir, dataset, *overrides, timeout=timeout, env=env, common=common, config=config)
    return records(run_dir)


def records(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def reached(run_dir, step: int) -> bool:
    """Whether the run has logged `step` yet. For polling a live run: the trainer may be halfway
    through appending a line, which read_metrics skips (its warning is expected here)."""
    import warnings

    from rgpt_dist.train.metrics import read_metrics

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return any(r["step"] >= step for _, r in read_metrics(Path(run_dir) / "metrics.jsonl"))


def losses(recs):
    return [(r["step"], r["loss"]) for r in recs if "loss" in r]


def trajectory(recs):
    """What a run computed, without its timings: per train record (step, r, loss, grad_norm, lr,
    skipped), per eval record (step, val_loss, early_exit). Equal trajectories = the same training."""
    return ([(r["step"], r["r"], r["loss"], r["grad_norm"], r["lr"], r["skipped"]) for r in recs if "loss" in r],
            [(r["step"], r["val_loss"], r.get("early_exit")) for r in recs if "val_loss" in r])


def assert_same_training(got, ref, rel, grad_norm=True, grad_norm_rel=None):
    """`got` trained like `ref` (both metrics records): the same steps and depths, and loss, grad_norm
    and the validation losses (val_loss, early_exit) equal to `rel` (the gradient norm to
    `grad_norm_rel` where given: a caller whose norm is more sensitive to float32 summation order
    than its loss, with that sensitivity measured). Losses alone can hide a uniform gradient scale
    (AdamW normalises it away: a sum instead of a mean over ranks trains the same), the gradient norm
    cannot; grad_norm=False only where the run does not log one (see its caller)."""
    (train_got, val_got), (train_ref, val_ref) = trajectory(got), trajectory(ref)
    assert [(s, r) for s, r, *_ in train_got] == [(s, r) for s, r, *_ in train_ref]
    assert [s for s, *_ in val_got] == [s for s, *_ in val_ref] and val_ref, "no evaluation to compare"
    for (step, _, loss, norm, lr, _), (_, _, loss_ref, norm_ref, lr_ref, _) in zip(train_got, train_ref):
        assert loss == pytest.approx(loss_ref, rel=rel), ("loss", step)
        assert lr == pytest.approx(lr_ref, rel=1e-12), ("lr", step)
        if grad_norm:
            assert norm_ref > 0, f"the reference logs no gradient norm at step {step}: the check would be vacuous"
            assert norm == pytest.approx(norm_ref, rel=grad_norm_rel or rel), ("grad_norm", step)
    for (step, val, curve), (_, val_ref_, curve_ref) in zip(val_got, val_ref):
        assert val == pytest.approx(val_ref_, rel=rel), ("val_loss", step)
        assert (curve is None) == (curve_ref is None)
        if curve is not None:
            assert curve == pytest.approx(curve_ref, rel=rel), ("early_exit", step)


def resumed_line(run_dir, step: int) -> str:
    """What rank 0 prints after loading the checkpoint of `step` (rgpt_dist/train/trainer.py)."""
    return f"resumed from {Path(run_dir) / 'checkpoints' / f'step_{step:08d}'} at step {step}"


def newest_complete_checkpoint(run_dir) -> int:
    """The step of the newest checkpoint with its completion record (checksums.json): where a restart
    must resume."""
    done = [int(p.parent.name.removeprefix("step_")) for p in (Path(run_dir) / "checkpoints").glob("step_*/checksums.json")]
    return max(done)


def plant_stale_records(run_dir, after: int) -> None:
    """Replace the metrics records of steps after `after` by obviously wrong ones (loss -1, ...): a
    restart from the checkpoint of `after` must drop and recompute them, and a run that trained
    nothing (or resumed elsewhere and kept the old lines) then fails the comparison."""
    path = Path(run_dir) / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["step"] > after:
            r = {**r, **{k: -1.0 for k in ("loss", "grad_norm", "val_loss") if k in r}}
        out.append(json.dumps(r))
    path.write_text("".join(line + "\n" for line in out))
