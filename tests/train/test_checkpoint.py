import json

import pytest
import torch.distributed as dist

from rgpt_dist.train.checkpoint import CheckpointManager, _checksums, verify


@pytest.fixture
def single_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def fake_checkpoint(root, step, complete=True):
    tag = root / f"step_{step:08d}"
    tag.mkdir(parents=True)
    (tag / "model.pt").write_bytes(bytes([step % 256]) * 1000)
    (tag / "optim.pt").write_bytes(b"optimizer state" * 10)
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
