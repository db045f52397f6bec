"""rgpt-algo train | eval | table: checkpoint selection (minimum validation loss, earliest on ties, the
checkpoint must exist), the refusals (exit status 2, one line, before any work), and one tiny run of
the whole protocol: three seeds of a very small model trained on parity through `rgpt-algo train`,
evaluated on two test lengths (--limit: the first examples only, not the paper's protocol), and the
three-seed table."""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import yaml

from rgpt_dist.algorithmic.cli import main
from rgpt_dist.algorithmic.evaluate import SelectionError, select_checkpoint, select_from_records, select_last

SEEDS = (42, 43, 44)
LIMIT = 24
TINY = ["model.d_model=16", "model.n_head=2", "model.n_layer=1", "model.d_ff=32", "train.max_steps=6",
        "train.warmup_steps=1", "train.micro_batch_size=8", "train.global_batch_size=8", "train.lr=3e-3",
        "train.min_lr=3e-4", "eval.every_steps=2", "checkpoint.every_steps=2", "checkpoint.keep_last=1",
        "log.every_steps=1", "log.wandb=disabled"]
# the tables' name of the model: the flavour and the model fields TINY changes (evaluate.model_label)
LABEL = "rlt-transformer-debug d_model=16 n_head=2 n_layer=1 d_ff=32"


def _tag(ckpt, step):
    """A checkpoint directory that verifies (a file and its sha256 in checksums.json)."""
    d = ckpt / f"step_{step:08d}"
    d.mkdir(parents=True)
    (d / "w.pt").write_bytes(b"weights")
    (d / "checksums.json").write_text(json.dumps({"w.pt": hashlib.sha256(b"weights").hexdigest()}))
    return d


def _run_dir(tmp_path, model=None, task="parity", records=()):
    run = tmp_path / "run"
    run.mkdir()
    model = model or {"family": "gpt2", "pos_encoding": "rope", "block_size": 64}
    (run / "config.yaml").write_text(yaml.safe_dump({"model": model, "data": {"task": task}, "train": {"seed": 1}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_selection_rule_min_loss_earliest_tie_existing_only():
    recs = [{"step": 100, "val_loss": 0.5}, {"step": 200, "val_loss": 0.3}, {"step": 300, "val_loss": 0.3},
            {"step": 400, "val_loss": 0.1}, {"step": 500, "val_loss": float("nan")}, {"step": 600, "val_loss": None}]
    assert select_from_records(recs, lambda s: s != 400) == (200, 0.3)     # 400's checkpoint is gone
    assert select_from_records(recs, lambda s: s in (100, 300)) == (300, 0.3)
    assert select_from_records(recs, lambda s: True) == (400, 0.1)
    assert select_from_records(recs, lambda s: s >= 500) is None            # non-finite losses never win
    resumed = [{"step": 100, "val_loss": 0.2}, {"step": 100, "val_loss": 0.4}, {"step": 200, "val_loss": 0.3}]
    assert select_from_records(resumed, lambda s: True) == (200, 0.3)       # a re-evaluated step: its last record


def test_select_checkpoint_reads_best_json_else_metrics(tmp_path):
    run = _run_dir(tmp_path, records=[{"step": 2, "val_loss": 0.7}, {"step": 4, "val_loss": 0.5},
                                      {"step": 6, "val_loss": 0.5}, {"step": 8, "val_loss": 0.2}])
    ckpt = run / "checkpoints"
    for step in (2, 4, 6):
        _tag(ckpt, step)
    (ckpt / "step_00000008").mkdir()                         # incomplete: no checksums.json
    chosen = select_checkpoint(run)
    assert (chosen.tag_dir.name, chosen.step, chosen.val_loss, chosen.source) == ("step_00000004", 4, 0.5, "metrics.jsonl")
    (ckpt / "best.json").write_text(json.dumps({"tag": "step_00000006", "step": 6, "val_loss": 0.5}))
    assert select_checkpoint(run).tag_dir.name == "step_00000006"          # the trainer's record wins
    (ckpt / "best.json").write_text(json.dumps({"tag": "step_00000008", "step": 8, "val_loss": 0.2}))
    with pytest.raises(SelectionError, match="names step_00000008, which is missing or incomplete"):
        select_checkpoint(run)


def test_select_last_takes_max_steps_only(tmp_path, capsys):
    """--checkpoint last: the checkpoint at train.max_steps whatever the losses, its validation loss
    the last record at that step; a run short of it (or without max_steps) is refused naming it."""
    run = _run_dir(tmp_path, records=[{"step": 4, "val_loss": 0.1}, {"step": 6, "val_loss": 0.9},
                                      {"step": 6, "val_loss": 0.8}])
    config = {"data": {"task": "parity"}, "train": {"seed": 1, "max_steps": 6}}
    _tag(run / "checkpoints", 4)
    with pytest.raises(SelectionError, match=r"step_00000006 \(train.max_steps=6\) is missing or incomplete"):
        select_last(run, config)
    _tag(run / "checkpoints", 6)
    chosen = select_last(run, config)
    assert (chosen.tag_dir.name, chosen.step, chosen.val_loss, chosen.source) == ("step_00000006", 6, 0.8,
                                                                                   "train.max_steps")
    assert select_checkpoint(run, config).step == 4                         # best: the minimum loss
    with pytest.raises(SelectionError, match="no positive train.max_steps"):
        select_last(run, {"train": {"seed": 1}})
    _refused(capsys, ["eval", str(run), "--checkpoint", "last"], "no positive train.max_steps")
    _refused(capsys, ["eval", str(run), "--checkpoint", "first"], "invalid choice: 'first'")


def _refused(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def test_train_refusals_exit_2_before_any_process(tmp_path, capsys):
    out = tmp_path / "r"
    _refused(capsys, ["train", "nosuch", "--model", "rlt-transformer-debug", "--seed", "42", "--out", str(out)],
             "unknown task 'nosuch'", "parity")
    _refused(capsys, ["train", "parity", "--model", "rlt-transformer-debug", "--seed", "42", "--out", str(out),
                      "train.lr=-1", "train.seq_len=8"], "train.lr=-1", "train.seq_len=8 is too short")
    _refused(capsys, ["train", "parity", "--model", "no-such-flavour", "--seed", "42", "--out", str(out)],
             "no-such-flavour")
    _refused(capsys, ["train", "parity", "--seed", "42", "--out", str(out)], "--model")
    _refused(capsys, ["train", "parity", "--model", "x", "--seed", "42", "--out", str(out), "--nproc", "0"], "--nproc")
    assert not out.exists()


def test_eval_and_table_refusals_exit_2(tmp_path, capsys):
    run = _run_dir(tmp_path)
    _refused(capsys, ["eval", str(run), "--lengths", "33"], "length 33 is not in its test grid")
    _refused(capsys, ["eval", str(run), "--lengths", "5000"], "length 5000 is outside its range")
    _refused(capsys, ["eval", str(run), "--lengths", ","], "the list of lengths is empty")
    _refused(capsys, ["eval", str(run), "--lengths", "32,x"], "comma-separated integers")
    _refused(capsys, ["eval", str(run)], "no checkpoint to select")        # the checks above come first
    learned = {"family": "gpt2", "pos_encoding": "learned", "block_size": 100}
    (tmp_path / "run").rename(tmp_path / "old")
    run = _run_dir(tmp_path, model=learned)
    _refused(capsys, ["eval", str(run)], "test length 128 needs 129 tokens but model.block_size=100")
    _refused(capsys, ["eval", str(run), "--lengths", "32,64"], "no checkpoint to select")   # those fit
    (tmp_path / "run").rename(tmp_path / "old2")
    run = _run_dir(tmp_path, task="")
    _refused(capsys, ["eval", str(run)], "not trained on an algorithmic task")
    _refused(capsys, ["eval", str(tmp_path / "absent")], "does not exist")
    _refused(capsys, ["table", str(tmp_path / "old"), "--out", str(tmp_path / "t")], "no eval.json under")
    _refused(capsys, ["frobnicate"], "invalid choice")


# ---- one tiny end-to-end run -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def protocol(tmp_path_factory):
    """Three seeds of a 1-layer width-16 model, 6 steps of 8 parity examples, validation and
    checkpoints every 2 steps; each evaluated at lengths 32 and 40 on LIMIT examples, the last seed's
    last checkpoint at 40 too; the table."""
    root = tmp_path_factory.mktemp("algo")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")     # rgpt-algo's default for one process is the paper's 4 threads
        mp.setenv("WANDB_MODE", "disabled")
        for seed in SEEDS:
            run = root / f"parity-s{seed}"
            assert main(["train", "parity", "--model", "rlt-transformer-debug", "--seed", str(seed), "--out",
                         str(run), *TINY]) == 0
            assert main(["eval", str(run), "--lengths", "32,40", "--limit", str(LIMIT)]) == 0
        # the fixed last step (train.max_steps = 6), one seed: RUN/eval-last
        assert main(["eval", str(run), "--lengths", "40", "--limit", str(LIMIT), "--checkpoint", "last"]) == 0
    assert main(["table", str(root), "--out", str(root / "table")]) == 0
    return root


def test_the_selected_checkpoint_is_the_minimum_validation_loss(protocol):
    for seed in SEEDS:
        run = protocol / f"parity-s{seed}"
        evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        evals = [(r["val_loss"], r["step"]) for r in evals if "val_loss" in r]
        assert [s for _, s in evals] == [2, 4, 6]
        loss, step = min(evals)                                   # ties: the smaller step sorts first
        result = json.loads((run / "eval" / "eval.json").read_text())
        assert (result["step"], result["val_loss"], result["checkpoint"]) == (step, loss, f"step_{step:08d}")
        assert result["seed"] == seed and result["model"] == LABEL and result["limit"] == LIMIT
        assert result["train_lengths"] == [3, 40]                   # the whole grid: no data.task_train_max
        assert set(result["test"]) == {"32", "40"}
        assert result["test"]["32"]["final_total"] == LIMIT and result["validation"]["pooled"]["final_total"] == 3 * LIMIT
        assert result["checkpoint_choice"] == "best" and (run / "eval-last").exists() == (seed == SEEDS[-1])
    last = json.loads((run / "eval-last" / "eval.json").read_text())         # --checkpoint last: step 6
    assert (last["step"], last["checkpoint"], last["checkpoint_choice"]) == (6, "step_00000006", "last")
    assert last["val_loss"] == dict((s, v) for v, s in evals)[6] and set(last["test"]) == {"40"}


def test_eval_scores_equal_an_independent_recount(protocol):
    """The final-label accuracy at length 40 recomputed here: the checkpoint's model on the first LIMIT
    test examples, the prediction at each example's last bit against the parity of its bits."""
    import torch

    from rgpt_dist.algorithmic import get_task
    from rgpt_dist.checkpoints.consolidate import consolidate
    from rgpt_dist.registry import build_model

    run = protocol / "parity-s43"
    result = json.loads((run / "eval" / "eval.json").read_text())
    c = consolidate(run / "checkpoints" / result["checkpoint"])
    model = build_model(c.config.model)
    model.load_state_dict(c.state_dict)
    task = get_task("parity")
    right = 0
    for i in range(LIMIT):
        tokens = task.example("test", i, 40).tokens                         # <bos> b1 .. b40
        bits = [int(task.vocab[t]) for t in tokens[1:]]
        with torch.no_grad():
            logits = model.eval()(torch.tensor(tokens)[None]).logits[0, -1]
        right += int(int(logits.argmax()) == task.vocab.index(str(sum(bits) % 2)))
    assert result["test"]["40"]["final_correct"] == right
    assert result["test"]["40"]["final"] == right / LIMIT


def test_the_three_seed_table(protocol):
    data = json.loads((protocol / "table" / "table.json").read_text())
    group, last = data["groups"]                                           # best, then last checkpoints
    assert (group["checkpoint"], last["checkpoint"], last["seeds"]) == ("best", "last", [SEEDS[-1]])
    assert group["seeds"] == list(SEEDS) and group["lengths"] == [32, 40]
    values = [100 * json.loads((protocol / f"parity-s{s}" / "eval" / "eval.json").read_text())["test"]["40"]["final"]
              for s in SEEDS]
    stat = group["metrics"]["final"]["40"]
    mean = sum(values) / 3
    assert stat["values"] == values and stat["mean"] == pytest.approx(mean, abs=1e-12)
    assert stat["sd"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / 2), abs=1e-12)
    md = (protocol / "table" / "table.md").read_text()
    assert "Not the paper's protocol" in md and "| Parity (40) |" in md
    assert (protocol / "table" / "accuracy_vs_length.png").stat().st_size > 10_000
    assert np.isfinite(stat["mean"])


def test_a_config_that_contradicts_its_checkpoint_is_refused(protocol, tmp_path, capsys):
    """A run directory whose config.yaml was edited after training (another task, a deeper model, another
    seed) is not evaluated: the report would name a model the checkpoint does not hold."""
    import shutil
    for section, key, value in (("data", "task", "s5_swaps"), ("model", "n_layer", 2), ("train", "seed", 7)):
        run = tmp_path / f"{section}.{key}"
        shutil.copytree(protocol / f"parity-s{SEEDS[0]}", run)
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert config[section][key] != value
        config[section][key] = value
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        _refused(capsys, ["eval", str(run), "--lengths", "32", "--limit", "8"], f"config.yaml's {section}.{key}=",
                 "contradicts the checkpoint")
