"""best.json (checkpoint.keep_best) kept consistent with the checkpoints it names: written before
`latest` moves, rewritten on resume from the best the checkpoint's client state carries (a kill
between a new best's record and its best.json), and read as data: a FIFO planted at it cannot block
the trainer, a tag that is not a checkpoint tag names nothing."""
import json
import os

from rgpt_dist.checkpoints.record import RECORD, checksums
from rgpt_dist.train import checkpoint as ckpt_module
from rgpt_dist.train.checkpoint import BEST, CheckpointManager
from tests.helpers.fifo import no_block


def _complete(directory, step):
    tag = directory / f"step_{step:08d}"
    tag.mkdir(parents=True)
    (tag / "weights.pt").write_bytes(b"w")
    (tag / RECORD).write_text(json.dumps(checksums(tag)))
    return tag


def test_a_fifo_at_best_json_does_not_block_the_trainer(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1, rank=0)
    os.mkfifo(tmp_path / BEST)
    assert no_block(manager.best_tag, tmp_path / BEST) is None


def test_best_json_names_only_checkpoint_tags_of_its_step(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1, rank=0)
    for record in ({"tag": "../../elsewhere", "step": 3, "val_loss": 1.0},
                   {"tag": "step_00000004", "step": 3, "val_loss": 1.0}, [1]):
        (tmp_path / BEST).write_text(json.dumps(record))
        assert manager.best_tag() is None
    (tmp_path / BEST).write_text(json.dumps({"tag": "step_00000003", "step": 3, "val_loss": 1.0}))
    assert manager.best_tag() == "step_00000003"


def test_a_resume_names_the_best_its_state_carries_and_pruning_keeps_it(tmp_path):
    """Killed after step 4's record (a new best) but before its best.json: best.json still names
    step 2. The resumed trainer's state says the best is step 4: best.json is rewritten, and step 4
    is never pruned."""
    manager = CheckpointManager(tmp_path, keep_last=1, rank=0)
    for step in (2, 4):
        _complete(tmp_path, step)
    (tmp_path / BEST).write_text(json.dumps({"tag": "step_00000002", "step": 2, "val_loss": 2.0}))
    manager.record_best({"step": 4, "val_loss": 1.5})
    assert json.loads((tmp_path / BEST).read_text()) == {"tag": "step_00000004", "step": 4, "val_loss": 1.5}
    for step in (6, 8):
        _complete(tmp_path, step)
    manager._prune()
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_00000004", "step_00000008"]
    CheckpointManager(tmp_path, keep_last=1, rank=1).record_best({"step": 8, "val_loss": 1.0})  # rank 1: nothing
    assert manager.best_tag() == "step_00000004"


def test_best_json_is_written_before_latest(tmp_path, monkeypatch):
    written = []
    monkeypatch.setattr(ckpt_module, "atomic_write_text", lambda path, text: written.append(os.path.basename(path)))
    monkeypatch.setattr(ckpt_module, "fsync_tree", lambda path: None)
    monkeypatch.setattr(ckpt_module, "checksums", lambda path: {})
    manager = CheckpointManager(tmp_path, keep_last=3, rank=0)
    manager._complete(tmp_path / "step_00000005", 5, {"config": {}}, {"step": 5, "val_loss": 1.0})
    assert written.index(BEST) < written.index("latest")
