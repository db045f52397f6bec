"""Training on an algorithmic task (data.task) through the real launcher, with the paper's loss
normalisation (train.loss_norm=example) and checkpoint selection (checkpoint.keep_best): one short
reference run and one run resumed from its best checkpoint, shared by the module; the selection
rule, pruning and the config errors also without a run."""
from __future__ import annotations

import itertools
import json
import math
import shutil

import pytest
import torch

from rgpt_dist.algorithmic import get_task
from rgpt_dist.algorithmic.capped import capped
from rgpt_dist.algorithmic.evaluate import trained_lengths
from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.checkpoints.consolidate import consolidate
from rgpt_dist.train.checkpoint import CheckpointManager, verify
from rgpt_dist.train.trainer import improves
from tests.helpers.dist import torchrun
from tests.helpers.runs import plant_stale_records, records, resumed_line, trajectory
from tests.train.test_checkpoint import fake_checkpoint

CONFIG = "configs/experiments/gpt2-small-20k.yaml"
STEPS = 6
# A 1-layer GPT-2 on parity (41 tokens at most); lr 1.0 makes the validation loss rise after step 1
# (measured: 0.97, 17.9, 25.4, 49.5, 5.2, 5.4), so the best checkpoint is older than the newest and
# must survive keep_last=1. ZeRO-1, fp32, CPU: a resumed run is bitwise the uninterrupted one.
ARGS = ["model=gpt2-debug", "model.vocab_size=8", "model.n_layer=1", "model.d_model=32", "model.block_size=48",
        "data.task=parity", "data.paths=[]", "train.seq_len=41", "train.micro_batch_size=4",
        "train.global_batch_size=8", f"train.max_steps={STEPS}", "train.warmup_steps=1", "train.lr=1.0",
        "train.loss_norm=example", "eval.every_steps=1", "checkpoint.every_steps=100", "checkpoint.keep_last=1",
        "checkpoint.keep_best=true", "parallel.zero_stage=1", "parallel.dtype=fp32", "log.every_steps=1",
        "log.wandb=disabled",
        # a length curriculum that grows on every third step (any loss is below 100): 3-16, 3-32 from step 4,
        # the whole grid (3-40) after step 6; the resumed run must continue it (cap and count) too
        "data.task_train_max=16", "data.task_grow_by=16", "data.task_grow_loss=100", "data.task_grow_steps=3"]


def launch(run):
    return torchrun("launcher.train", 1, CONFIG, *ARGS, f"log.run_dir={run}", timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(reference run directory, resumed run directory, the resumed run's stdout). The resumed run is
    a copy of the reference rewound to its best checkpoint (later checkpoints deleted, stale records
    planted after it), then launched again: it must resume there and finish as the reference did."""
    root = tmp_path_factory.mktemp("algorithmic")
    ref, resumed = root / "ref", root / "resumed"
    launch(ref)
    shutil.copytree(ref, resumed)
    best = json.loads((resumed / "checkpoints" / "best.json").read_text())
    assert best["step"] < STEPS, "the run's best is its last step: nothing to rewind to"
    for tag in (resumed / "checkpoints").glob("step_*"):
        if tag.name != best["tag"]:
            shutil.rmtree(tag)
    (resumed / "checkpoints" / "latest").write_text(best["tag"])
    plant_stale_records(resumed, after=best["step"])
    return ref, resumed, launch(resumed)


def val_losses(run):
    return [(r["step"], r["val_loss"]) for r in records(run) if "val_loss" in r]


def test_best_json_names_the_earliest_minimum_validation_loss(runs):
    ref = runs[0]
    losses = val_losses(ref)
    assert [s for s, _ in losses] == list(range(1, STEPS + 1))
    low = min(v for _, v in losses)
    step = next(s for s, v in losses if v == low)
    best = json.loads((ref / "checkpoints" / "best.json").read_text())
    assert best == {"tag": f"step_{step:08d}", "step": step, "val_loss": low}
    manager = CheckpointManager(ref / "checkpoints", keep_last=1, rank=0)
    assert manager.best_tag() == best["tag"] and verify(ref / "checkpoints" / best["tag"]) is None
    assert consolidate(ref / "checkpoints" / best["tag"]).step == step


def test_the_best_checkpoint_survives_pruning_with_keep_last_1(runs):
    ref = runs[0]
    best = json.loads((ref / "checkpoints" / "best.json").read_text())
    tags = sorted(p.name for p in (ref / "checkpoints").glob("step_*"))
    assert best["step"] < STEPS and tags == [best["tag"], f"step_{STEPS:08d}"]


def test_a_resumed_run_reads_the_same_examples_and_ends_with_the_same_weights(runs):
    ref, resumed, output = runs
    best = json.loads((ref / "checkpoints" / "best.json").read_text())
    assert resumed_line(resumed, best["step"]) in output, output[-3000:]
    assert trajectory(records(resumed)) == trajectory(records(ref))  # bitwise: the same examples, in order
    final = [consolidate(run / "checkpoints" / f"step_{STEPS:08d}").state_dict for run in (ref, resumed)]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    # the selection continued from the checkpoint's client state: no later (worse) step became best
    assert json.loads((resumed / "checkpoints" / "best.json").read_text()) == best


def test_the_curriculum_grows_where_it_must_and_tokens_count_each_step_s_width(runs):
    """Growth after steps 3 and 6 (logged with the cap reached), batches of 17 then 33 tokens."""
    ref = runs[0]
    train = [r for r in records(ref) if "loss" in r]
    assert [(r["step"], r["task_train_max"]) for r in train if "task_train_max" in r] == [(3, 32), (6, 40)]
    assert [r["tokens"] for r in train] == [8 * n for n in (17, 34, 51, 84, 117, 150)]
    config = {"data": {"task": "parity", "task_train_max": 16}}
    spans = [trained_lengths(get_task("parity"), ref, config, step) for step in (3, 4, 6, 7)]
    assert [(s[0], s[-1]) for s in spans] == [(3, 16), (3, 32), (3, 32), (3, 40)]  # what rgpt-algo eval reports


@pytest.fixture(scope="module")
def sorted_run(tmp_path_factory):
    """The reference run's config with length buckets (data.task_sort_by_length: 2 micro-batches of 4)."""
    run = tmp_path_factory.mktemp("sorted") / "run"
    torchrun("launcher.train", 1, CONFIG, *ARGS, "data.task_sort_by_length=true", f"log.run_dir={run}", timeout=300)
    return run


def test_length_buckets_train_the_same_examples_and_count_each_bucket_s_width(runs, sorted_run):
    """Each step's 8 examples (their lengths read here, at the curriculum's cap) sorted into two
    micro-batches of 4, each as wide as its longest: the tokens logged are 4 x both widths. The first
    step's loss is the reference's (the same examples, other micro-batches, before any update): equal
    to fp32 rounding, measured 1.2e-7 relative; bounded by 1e-6, 16 ulps (2^-24 each) of a mean of 8
    cross-entropies over a width-32 layer."""
    caps = [16, 16, 16, 32, 32, 32]  # the curriculum's cap at steps 1-6 (the reference test's growth)
    widths = []
    for step, cap in enumerate(caps):
        task = capped(get_task("parity"), cap)
        lengths = sorted(len(task.example("train", i, None).tokens) for i in range(step * 8, step * 8 + 8))
        widths.append(4 * (lengths[3] + lengths[7]))
    train = [r for r in records(sorted_run) if "loss" in r]
    assert [r["tokens"] for r in train] == list(itertools.accumulate(widths))
    assert [(r["step"], r["task_train_max"]) for r in train if "task_train_max" in r] == [(3, 32), (6, 40)]
    first = next(r for r in records(runs[0]) if "loss" in r)
    assert math.isclose(train[0]["loss"], first["loss"], rel_tol=1e-6), (train[0]["loss"], first["loss"])


def test_the_selection_rule_keeps_the_earliest_of_equal_losses():
    """Planted losses with exact ties and a NaN: strictly lower wins, a tie keeps the earlier step."""
    best = None
    picks = []
    for step, loss in enumerate([3.0, 2.0, 2.5, 2.0, float("nan"), 2.0, 1.5, 1.5], start=1):
        if improves(best, loss):
            best = {"step": step, "val_loss": loss}
            picks.append(step)
    assert picks == [1, 2, 7]
    assert not improves(None, float("inf")) and not improves(None, math.nan)


def test_pruning_never_deletes_the_best_tag(tmp_path):
    for step in (10, 20, 30, 40):
        fake_checkpoint(tmp_path, step)
    (tmp_path / "best.json").write_text(json.dumps({"tag": "step_00000020", "step": 20, "val_loss": 1.0}))
    manager = CheckpointManager(tmp_path, keep_last=1, rank=0)
    manager._prune()
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_00000020", "step_00000040"]
    for junk in ('{"tag": "../x"}', "[1]", "not json", '{"tag": 20}'):
        (tmp_path / "best.json").write_text(junk)
        assert manager.best_tag() is None


def _problems(*overrides):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIG, ["model=gpt2-debug", "data.paths=[]", "data.task=parity", "train.seq_len=48",
                             "model.block_size=48", *overrides])
    return e.value.problems


@pytest.mark.parametrize("overrides,message", [
    (["data.task=parityy"], "data.task='parityy' is not an algorithmic task (addition, mod5_brackets, mod5_flat, "
                            "parity, s5_standard, s5_swaps) or a thinking task (graph, logic, relational)"),
    (["train.seq_len=40"], "train.seq_len=40 is too short for data.task='parity': the longest parity training or "
                           "validation example has 41 tokens; set train.seq_len >= 41"),
    (["model.block_size=40", "train.seq_len=40"],
     "model.block_size=40 is too small for data.task='parity' with model.pos_encoding=learned: the longest parity "
     "training or validation example has 41 tokens; set model.block_size >= 41"),
    (["model.vocab_size=4"], "model.vocab_size=4 is smaller than data.task='parity''s vocabulary of 5 tokens"),
    (["checkpoint.keep_best=true", "eval.every_steps=0"],
     "checkpoint.keep_best=true needs evaluations to select from: set eval.every_steps > 0 (got 0)"),
    (["train.loss_norm=mean"], "train.loss_norm='mean' is not one of ['token', 'example']"),
    (["data.task="], "data.paths is empty: give at least one rgpt-prep output (or data.task)"),
    (["data.task_grow_by=8"], "data.task_grow_by=8 grows data.task_train_max, which is 0 (the whole grid): set "
                              "the cap to start from, e.g. data.task_train_max=16"),
    (["data.task_grow_loss=0.0"], "data.task_grow_loss=0.0 must be > 0"),
    (["data.task_grow_steps=0"], "data.task_grow_steps=0 must be >= 1"),
])
def test_config_errors_name_the_values(overrides, message):
    assert message in _problems(*overrides)


def test_a_task_config_needs_no_data_paths():
    cfg = load_config(CONFIG, ["model=gpt2-debug", "data.paths=[]", "data.task=addition", "train.seq_len=38",
                               "model.block_size=38", "model.vocab_size=20", "model.pos_encoding=rope"])
    assert cfg.data.task == "addition" and cfg.train.loss_norm == "token" and not cfg.checkpoint.keep_best


def _resume_against(saved_edit):
    """resume() against a checkpoint whose recorded config is a parity run's edited by `saved_edit`;
    loading state fails the test (the check comes first)."""
    from tests.helpers.resume import resuming_trainer

    cfg = load_config(CONFIG, ["model=gpt2-debug", "data.paths=[]", "data.task=parity", "train.seq_len=48",
                               "model.block_size=48"])
    saved = cfg.to_dict()
    saved_edit(saved)
    resuming_trainer(cfg, saved).resume()


def test_a_checkpoint_of_another_task_is_refused_before_loading():
    from rgpt_dist.train.trainer import DifferentRun

    with pytest.raises(DifferentRun, match=r"data.task: checkpoint 's5_swaps', config 'parity'"):
        _resume_against(lambda saved: saved["data"].update(task="s5_swaps"))


def test_a_checkpoint_older_than_a_config_field_resumes_as_its_default():
    """A checkpoint written before data.task / model.pos_encoding existed ran with their defaults: a
    config with the defaults goes on to load it; one with another value is refused."""
    from rgpt_dist.train.trainer import DifferentRun

    def older(saved):
        del saved["model"]["pos_encoding"], saved["data"]["task"], saved["train"]["loss_norm"]
    with pytest.raises(DifferentRun, match=r"data.task: checkpoint '', config 'parity'"):
        _resume_against(older)

    def older_lm(saved):
        older(saved)
        saved["data"]["task"] = "parity"   # only the model field is missing now
    with pytest.raises(AssertionError, match="state was loaded"):
        _resume_against(older_lm)
