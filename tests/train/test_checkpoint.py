import json

import pytest
import torch
import torch.distributed as dist

from rgpt_dist.safe_load import UntrustedCheckpoint
from rgpt_dist.checkpoints.record import checksums as _checksums, verify
from rgpt_dist.train.checkpoint import CheckpointManager
from tests.helpers.hostile import poison_pt, rewrite_checksums


@pytest.fixture
def single_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def fake_checkpoint(root, step, complete=True):
    tag = root / f"step_{step:08d}"
    tag.mkdir(parents=True)
    torch.save({"module": {"w": torch.full((250,), float(step))}}, tag / "model.pt")
    torch.save({"optimizer_state_dict": {"step": step}}, tag / "optim.pt")
    if complete:
        (tag / "checksums.json").write_text(json.dumps(_checksums(tag)))
    return tag


def test_verify_detects_incomplete_and_corrupted(tmp_path):
    good = fake_checkpoint(tmp_path, 10)
    assert verify(good) is None
    assert "incomplete" in verify(fake_checkpoint(tmp_path, 20, complete=False))
    bad = fake_checkpoint(tmp_path, 30)
    with open(bad / "model.pt", "r+b") as f:
        f.write(b"\xff")
    assert "corrupted (model.pt" in verify(bad)


def test_verify_requires_every_file_listed_and_nothing_else(tmp_path):
    """An emptied record, an unlisted or missing file, or a link in the directory is corrupted."""
    tag = fake_checkpoint(tmp_path, 10)
    (tag / "checksums.json").write_text("{}")
    assert "lists no files" in verify(tag) and "model.pt not listed" in verify(tag)
    rewrite_checksums(tag)
    (tag / "extra.pt").write_bytes(b"x")
    assert "extra.pt not listed" in verify(tag)
    (tag / "extra.pt").unlink()
    (tag / "optim.pt").unlink()
    assert "optim.pt missing" in verify(tag)
    (tag / "optim.pt").symlink_to(tag / "model.pt")
    assert "optim.pt: not a regular file" in verify(tag)
    for junk in ("[1, 2]", "not json", '{"model.pt": 3}'):
        (tag / "checksums.json").write_text(junk)
        assert "is not a JSON object" in verify(tag)


def test_a_verified_checkpoint_that_would_run_code_stops_the_resume(tmp_path, single_rank_group):
    """A tampered checkpoint (payload added, checksums recomputed) is refused by name, not skipped."""
    fake_checkpoint(tmp_path, 10)
    tag = fake_checkpoint(tmp_path, 20)
    poison_pt(tag / "optim.pt", tmp_path / "fired")
    rewrite_checksums(tag)
    with pytest.raises(UntrustedCheckpoint, match=r"step_00000020/optim.pt: refusing to load"):
        CheckpointManager(tmp_path, keep_last=3, rank=0).newest_valid()
    assert CheckpointManager(tmp_path, keep_last=3, rank=0, trust=True).newest_valid() == "step_00000020"
    assert not (tmp_path / "fired").exists()


def test_newest_valid_skips_torn_and_corrupted_checkpoints(tmp_path, single_rank_group):
    mgr = CheckpointManager(tmp_path, keep_last=3, rank=0)
    fake_checkpoint(tmp_path, 10)
    fake_checkpoint(tmp_path, 20)
    corrupted = fake_checkpoint(tmp_path, 30)
    (corrupted / "optim.pt").write_bytes(b"truncated")
    fake_checkpoint(tmp_path, 40, complete=False)  # killed while writing
    with pytest.warns(UserWarning) as caught:
        assert mgr.newest_valid() == "step_00000020"
    messages = " ".join(str(w.message) for w in caught)
    assert "step_00000040: incomplete" in messages and "step_00000030: corrupted" in messages
    assert CheckpointManager(tmp_path / "none", 3, 0).newest_valid() is None


def test_prune_keeps_the_last_complete_checkpoints(tmp_path):
    for step in (10, 20, 30, 40):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 50, complete=False)
    CheckpointManager(tmp_path, keep_last=2, rank=0)._prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000030", "step_00000040", "step_00000050"]
