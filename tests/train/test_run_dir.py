"""A run directory cannot be turned against its owner (docs/security.md, "Run directories"): links and
FIFOs planted where the trainer writes are refused by name, and nothing outside the directory changes."""
import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from launcher.train import main
from rgpt_dist.durable import UnsafePath, atomic_write_text, open_regular
from rgpt_dist.train.checkpoint import CheckpointManager, SaveRefused, verify
from rgpt_dist.train.metrics import read_metrics
from rgpt_dist.train.run_dir import unsafe_entries
from rgpt_dist.train.run_lock import lock_run_dir
from tests.helpers.dist import torchrun
from tests.helpers.runs import COMMON, QUICKSTART

VICTIM = "someone else's month of compute\n"


@pytest.fixture
def victim(tmp_path):
    """A file and a directory outside the run directory that a planted link points at."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "file").write_text(VICTIM)
    return tmp_path / "elsewhere"


def _unchanged(victim):
    assert (victim / "file").read_text() == VICTIM
    assert sorted(p.name for p in victim.iterdir()) == ["file"]


@pytest.fixture
def single_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


PLANTED = [  # (entry, kind): every entry the trainer writes
    (".lock", "link"), ("metrics.jsonl", "link"), ("config.yaml", "link"), ("wandb_run_id", "link"),
    ("wandb", "dirlink"), ("checkpoints", "dirlink"), ("checkpoints/latest", "link"),
    ("checkpoints/step_00000004", "dirlink"), ("checkpoints/step_00000008", "file"), ("metrics.jsonl", "fifo"),
    (".lock", "dir"),
]


def _plant(run, entry, kind, victim):
    path = run / entry
    path.parent.mkdir(parents=True, exist_ok=True)
    {"link": lambda: path.symlink_to(victim / "file"), "dirlink": lambda: path.symlink_to(victim),
     "file": lambda: path.write_text("planted"), "fifo": lambda: os.mkfifo(path), "dir": path.mkdir}[kind]()
    return path


@pytest.mark.parametrize("entry,kind", PLANTED, ids=[f"{e}-{k}" for e, k in PLANTED])
def test_every_planted_entry_is_named_before_the_run_starts(entry, kind, tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    path = _plant(run, entry, kind, victim)
    problems = unsafe_entries(run, None)
    assert len(problems) == 1 and problems[0].startswith(f"{path} is ") and "refusing" in problems[0]
    _unchanged(victim)


def test_a_clean_run_directory_and_a_users_own_linked_checkpoint_dir_pass(tmp_path, victim):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000002").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    (run / "wandb").mkdir()
    assert unsafe_entries(run, None) == [] and unsafe_entries(tmp_path / "absent", None) == []
    (tmp_path / "scratch").symlink_to(victim)  # checkpoint.dir itself is the user's choice...
    assert unsafe_entries(run, tmp_path / "scratch") == []
    (victim / "latest").symlink_to(victim / "file")  # ...its entries are not
    assert unsafe_entries(run, tmp_path / "scratch") == [
        f"{tmp_path / 'scratch' / 'latest'} is a symbolic link, not a regular file: refusing to write through it "
        "(remove it, or choose another run directory)"]


def test_the_launcher_exits_2_naming_the_planted_link_before_anything_runs(tmp_path, victim, dataset, monkeypatch,
                                                                           capsys):
    run = tmp_path / "run"
    run.mkdir()
    _plant(run, "metrics.jsonl", "link", victim)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert main([QUICKSTART, *COMMON, f"data.paths=[{dataset}]", f"log.run_dir={run}"]) == 2
    assert f"{run / 'metrics.jsonl'} is a symbolic link" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]  # not even the lock was taken
    _unchanged(victim)


def test_open_regular_refuses_links_and_fifos_without_blocking(tmp_path, victim):
    (tmp_path / "link").symlink_to(victim / "file")
    os.mkfifo(tmp_path / "fifo")
    for name, flags, what in [("link", os.O_WRONLY | os.O_APPEND, "a symbolic link"),
                              ("fifo", os.O_WRONLY | os.O_APPEND, "a FIFO"), ("fifo", os.O_RDONLY, "a FIFO")]:
        with pytest.raises(UnsafePath, match=f"{tmp_path / name} is {what}"):
            open_regular(tmp_path / name, flags)  # a blocking open of a FIFO would hang the test here
    os.close(open_regular(tmp_path / "new", os.O_WRONLY | os.O_CREAT))
    assert (tmp_path / "new").is_file()
    _unchanged(victim)


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_the_lock_does_not_truncate_or_block_on_a_planted_entry(kind, tmp_path, victim):
    _plant(tmp_path, ".lock", kind, victim)
    with pytest.raises(UnsafePath, match=r"\.lock is a"):
        lock_run_dir(tmp_path, wait_s=0)
    _unchanged(victim)


def test_metrics_are_not_appended_or_read_through_a_link(tmp_path, victim):
    from rgpt_dist.config import load_config
    from rgpt_dist.train.metrics import MetricsSink

    cfg = load_config(QUICKSTART, [f"log.run_dir={tmp_path}", "log.wandb=disabled"])
    sink = MetricsSink(cfg, is_main=True)
    sink.log({"step": 1, "loss": 2.0})
    os.replace(tmp_path / "metrics.jsonl", tmp_path / "kept")
    (tmp_path / "metrics.jsonl").symlink_to(victim / "file")  # planted mid-run
    with pytest.raises(UnsafePath, match="metrics.jsonl is a symbolic link"):
        sink.log({"step": 2, "loss": 1.0})
    with pytest.raises(UnsafePath, match="metrics.jsonl is a symbolic link"):
        read_metrics(tmp_path / "metrics.jsonl")
    _unchanged(victim)


def test_an_atomic_write_does_not_follow_a_link_at_its_temp_name(tmp_path, victim):
    (tmp_path / f".latest.tmp{os.getpid()}").symlink_to(victim / "file")
    atomic_write_text(tmp_path / "latest", "step_00000002")
    assert (tmp_path / "latest").read_text() == "step_00000002"
    _unchanged(victim)


@pytest.mark.parametrize("kind", ["dirlink", "file"])
def test_a_save_meeting_a_planted_step_entry_refuses_and_writes_nothing(kind, tmp_path, victim, single_rank_group):
    ckpt = tmp_path / "checkpoints"
    planted = _plant(ckpt, "step_00000004", kind, victim)
    with pytest.raises(SaveRefused, match=f"cannot save step 4: {planted} is a"):
        CheckpointManager(ckpt, keep_last=2, rank=0).save(engine=None, step=4, client_state={})
    assert os.path.lexists(planted) and sorted(p.name for p in ckpt.iterdir()) == ["step_00000004"]
    assert CheckpointManager(ckpt, keep_last=2, rank=0).tags() == []  # a link is never loaded or pruned
    _unchanged(victim)


def test_a_deeply_nested_checksum_record_is_a_corrupt_checkpoint(tmp_path):
    tag = tmp_path / "step_00000002"
    tag.mkdir()
    (tag / "model.pt").write_bytes(b"x")
    (tag / "checksums.json").write_text("[" * 100_000 + "]" * 100_000)
    assert verify(tag) == "corrupted (checksums.json is not a JSON object of file name -> sha256)"


def test_the_trainer_exits_2_when_its_save_meets_a_planted_link(tmp_path, victim, dataset):
    """Past the launcher's check (the link appears after the start): the save refuses on every rank,
    the run exits with status 2 and the message, and the link's target is untouched."""
    run = tmp_path / "run"
    _plant(run, "checkpoints/step_00000002", "dirlink", victim)
    out = tmp_path / "out.json"
    torchrun("tests.train.planted_save", 2, QUICKSTART, str(out), *COMMON, f"data.paths=[{dataset}]",
             f"log.run_dir={run}", "train.max_steps=4", "checkpoint.every_steps=2", "eval.every_steps=0")
    got = [json.loads((tmp_path / f"out.json.rank{rank}").read_text()) for rank in (0, 1)]
    assert [g["status"] for g in got] == [2, 2]
    assert f"cannot save step 2: {run / 'checkpoints' / 'step_00000002'} is a symbolic link" in got[0]["stderr"]
    _unchanged(victim)


def test_a_fifo_metrics_file_does_not_hang_a_reader(tmp_path):
    os.mkfifo(tmp_path / "metrics.jsonl")
    code = ("import sys; from rgpt_dist.train.metrics import read_metrics\n"
            "try: read_metrics(sys.argv[1])\nexcept Exception as e: print(type(e).__name__)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "metrics.jsonl")], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "UnsafePath"


def test_resuming_a_checkpoint_of_another_zero_stage_exits_2_on_every_rank(reference_run, dataset, tmp_path):
    """The refusal of a changed sharding (Trainer._check_same_run) is an exit status 2 with the
    message, like a bad config, not a traceback; nothing is loaded and nothing is written."""
    import shutil

    from tests.helpers.runs import DP

    run = shutil.copytree(reference_run[0], tmp_path / "run")  # the shared reference stays untouched
    before = [(run / name).read_bytes() for name in ("metrics.jsonl", "config.yaml")]
    out = tmp_path / "out.json"
    torchrun("tests.train.planted_save", 1, QUICKSTART, str(out), *COMMON, f"data.paths=[{dataset}]",
             f"log.run_dir={run}", *DP, "parallel.zero_stage=0")
    got = json.loads((tmp_path / "out.json.rank0").read_text())
    assert got["status"] == 2 and "Traceback" not in got["stderr"]
    assert ("was written at another layout (ZeRO-1, tp = 1, dp = 1 -> ZeRO-0, tp = 1, dp = 1) that cannot be "
            "converted: ZeRO-0 keeps no partitioned optimizer state") in got["stderr"], got["stderr"]
    assert [(run / name).read_bytes() for name in ("metrics.jsonl", "config.yaml")] == before

