"""A checkpoint save that fails mid-write (the disk full: a tmpfs sized for one checkpoint and a half)
on 2 ranks: every rank stops together with exit 74 and a message naming the file, the error and the
newest complete checkpoint, which stays the newest valid one (the torn attempt is removed); with room
again, the run resumes from it and trains bitwise like a run that never failed."""
import json
import os
import re
import subprocess

import pytest
import torch

from rgpt_dist.checkpoints.consolidate import consolidate
from rgpt_dist.train.checkpoint import verify
from tests.helpers.dist import torchrun
from tests.helpers.runs import COMMON, QUICKSTART, launch, records, trajectory

pytestmark = pytest.mark.slow

RUN = ["model.sigma_x=0", "model.sigma_g=0", "train.max_steps=6", "eval.every_steps=0", "checkpoint.every_steps=2",
       "parallel.zero_stage=2"]


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) -> a fresh tmpfs of `size` bytes; remount(size) resizes it. Root only (mount(2)),
    which CI is: there the test must run; elsewhere it says why it cannot."""
    if os.geteuid() != 0:
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail("CI runs as root: mounting a small tmpfs must work here")
        pytest.skip("mounting a size-limited tmpfs needs root")
    where = tmp_path / "disk"
    where.mkdir()

    def mount(size: int, remount: bool = False):
        opts = f"{'remount,' if remount else ''}size={size}"
        subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], check=True)
        return where
    yield mount
    subprocess.run(["umount", str(where)], check=False)


def test_a_save_that_fills_the_disk_stops_every_rank_and_the_run_resumes_bitwise(dataset, tmp_path, small_disk):
    ref = tmp_path / "ref"
    launch(2, ref, dataset, *RUN)
    newest = ref / "checkpoints" / "step_00000006"  # every step's checkpoint has the same size
    size = sum(p.stat().st_size for p in newest.rglob("*") if p.is_file())
    assert size > 1e6
    disk = small_disk(size * 3 // 2 // 4096 * 4096)  # the checkpoint of step 2 fits, step 4's does not
    run, ckpt = tmp_path / "run", disk / "ckpt"
    out = tmp_path / "out.json"
    torchrun("tests.train.planted_save", 2, QUICKSTART, str(out), *COMMON, f"data.paths=[{dataset}]",
             f"log.run_dir={run}", f"checkpoint.dir={ckpt}", *RUN)
    got = [json.loads((tmp_path / f"out.json.rank{r}").read_text()) for r in (0, 1)]
    assert [g["status"] for g in got] == [74, 74], got
    message = got[0]["stderr"]
    assert "the checkpoint of step 4 could not be written: rank" in message, message
    assert re.search(r"step_00000004/\S+: \w+Error: .* \([\d,]+ bytes free there\)", message), message
    assert "The newest complete checkpoint is step_00000002" in message and "Traceback" not in message
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_00000002"] and verify(ckpt / "step_00000002") is None
    assert (ckpt / "latest").read_text() == "step_00000002"

    small_disk(size * 8, remount=True)  # room again: the same command resumes
    stdout = launch(2, run, dataset, f"checkpoint.dir={ckpt}", *RUN)
    assert f"resumed from {ckpt / 'step_00000002'} at step 2" in stdout
    assert trajectory(records(run)) == trajectory(records(ref))
    a, b = consolidate(ckpt).state_dict, consolidate(ref).state_dict
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
