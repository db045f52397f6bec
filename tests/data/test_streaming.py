import collections
import hashlib
import json
from pathlib import Path

import pytest

from data_prep.cli import main as prep
from rgpt_dist.data.index import DatasetError
from tests.helpers.dist import torchrun

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A fixed synthetic corpus (so the sample count, and what streaming does with it, never changes)."""
    root = tmp_path_factory.mktemp("stream")
    (root / "in").mkdir()
    for i in range(120):
        words = " ".join(f"w{(i * 7919 + j * 104729) % 10007}" for j in range(40 + i % 13))
        (root / "in" / f"doc{i:03d}.txt").write_text(f"Document {i}: {words}.\n")
    out = root / "ds"
    assert prep([str(root / "in"), "--out", str(out), "--seq-len", "16", "--part-mb", "0.004",
                 "--val-fraction", "0.2"]) == 0
    return out


def all_hashes(root: Path) -> collections.Counter:
    from rgpt_dist.data.mds import import_streaming
    ds = import_streaming().LocalDataset(local=str(root / "train"))
    return collections.Counter(hashlib.sha1(ds[i]["tokens"][:-1].astype("int64").tobytes()).hexdigest()
                               for i in range(len(ds)))


def read(out: Path, world: int) -> list[list[list[str]]]:
    return [json.loads(Path(f"{out}.rank{r}.json").read_text())["batches"] for r in range(world)]


def test_single_process_loader_shapes_and_shift(dataset):
    from rgpt_dist.data.streaming import token_dataset, token_loader
    ds = token_dataset(dataset, "val", batch_size=3, shuffle=False)
    x, y = next(iter(token_loader(ds, batch_size=3)))
    assert x.shape == y.shape == (3, 16) and str(x.dtype) == "torch.int64"
    assert (x[:, 1:] == y[:, :-1]).all()
    with pytest.raises(DatasetError, match="not an rgpt-prep dataset split"):
        token_dataset(dataset, "test", batch_size=1)


def test_empty_split_is_a_clear_error(tmp_path):
    from rgpt_dist.data.streaming import token_dataset
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("just a few words of text")
    assert prep([str(tmp_path / "in"), "--out", str(tmp_path / "ds"), "--seq-len", "4", "--val-fraction", "0"]) == 0
    with pytest.raises(ValueError, match="holds no samples"):
        token_dataset(tmp_path / "ds", "val", batch_size=1)


@pytest.mark.slow
def test_two_ranks_read_disjoint_samples_covering_the_split(dataset, tmp_path):
    torchrun("tests.data.dist_read", 2, str(tmp_path / "all"), str(dataset), "all")
    ranks = read(tmp_path / "all", 2)
    seen = collections.Counter(h for batches in ranks for b in batches for h in b)
    expected = all_hashes(dataset)
    n = sum(expected.values())
    assert abs(len([h for b in ranks[0] for h in b]) - len([h for b in ranks[1] for h in b])) <= 2
    # Ranks are disjoint and cover the split, up to two edge effects at the end of an epoch:
    # streaming pads the sample list to a multiple of the world size by repeating < world samples,
    # and drop_last discards each rank's incomplete final micro-batch (< micro-batch samples).
    missing, extra = expected - seen, seen - expected
    assert sum(extra.values()) < 2 and sum(missing.values()) < 2 * 2
    assert sum(seen.values()) == n - sum(missing.values()) + sum(extra.values())


@pytest.mark.slow
def test_resumed_loader_continues_exactly(dataset, tmp_path):
    torchrun("tests.data.dist_read", 2, str(tmp_path / "run"), str(dataset), "all")
    full = read(tmp_path / "run", 2)
    torchrun("tests.data.dist_read", 2, str(tmp_path / "run"), str(dataset), "first", "5")
    first = read(tmp_path / "run", 2)
    torchrun("tests.data.dist_read", 2, str(tmp_path / "run"), str(dataset), "resume")
    rest = read(tmp_path / "run", 2)
    for r in range(2):
        assert first[r] == full[r][:5]
        assert rest[r] == full[r][5:]


@pytest.mark.slow
def test_resume_on_fewer_ranks_reads_exactly_the_unread_samples(dataset, tmp_path):
    """With num_canonical_nodes fixed, the global order does not depend on the world size: a state
    saved by 2 ranks resumed on 1 rank reads every unread sample once (docs/data.md)."""
    torchrun("tests.data.dist_read", 2, str(tmp_path / "run"), str(dataset), "first", "5")
    first = collections.Counter(h for batches in read(tmp_path / "run", 2) for b in batches for h in b)
    torchrun("tests.data.dist_read", 1, str(tmp_path / "run"), str(dataset), "resume")
    rest = collections.Counter(h for b in read(tmp_path / "run", 1)[0] for h in b)
    expected = all_hashes(dataset)
    assert sum(first.values()) == 20
    both = first + rest  # the same edge effects as above: < world repeated, < micro-batch dropped
    assert sum((both - expected).values()) < 2 and sum((expected - both).values()) < 2


def test_a_killed_reader_does_not_poison_the_next_run(dataset):
    import os
    import signal
    import subprocess
    import sys
    from rgpt_dist.data.streaming import cleanup_stale_state, token_dataset, token_loader
    cleanup_stale_state()  # what an earlier process left (streaming's cleanup stops at the first free prefix)
    before = set(os.listdir("/dev/shm"))
    # its own session, so the kill also takes its multiprocessing resource tracker, as a job kill
    # does (a surviving tracker would unlink the segments itself, racing the cleanup below)
    proc = subprocess.Popen([sys.executable, "-m", "tests.data.hold_dataset", str(dataset)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "READY"
    from rgpt_dist.data.streaming import REGISTRATION_LOCK
    with open(f"/proc/{proc.pid}/maps") as maps:  # the reader's own segments (another job on the host may add its own)
        mapped = {line.split("/dev/shm/", 1)[1].split()[0] for line in maps if "/dev/shm/" in line}
    leaked = (set(os.listdir("/dev/shm")) - before - {REGISTRATION_LOCK}) & mapped  # the lock file stays, empty
    assert leaked  # the reader holds shared memory...
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert leaked <= set(os.listdir("/dev/shm"))  # ...which a SIGKILL leaves behind
    cleanup_stale_state()
    assert not leaked & set(os.listdir("/dev/shm"))
    x, _ = next(iter(token_loader(token_dataset(dataset, "train", batch_size=2), batch_size=2)))
    assert x.shape == (2, 16)


def test_jobs_opening_datasets_on_one_host_at_once_all_register(dataset):
    """Streaming registers a dataset under the first free shared-memory prefix; without the host lock
    two processes released by one barrier found the same prefix in 9 rounds of 10 here and one died
    with FileExistsError (`rgpt-compare --jobs 2` failed so in CI). Three rounds of three."""
    import subprocess
    import sys
    for _ in range(3):
        out = subprocess.run([sys.executable, "-m", "tests.data.open_together", str(dataset), "3"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split("\n")[:3] == ["ok"] * 3, out.stdout + out.stderr[-2000:]


def test_importing_streaming_leaves_transformers_unloaded_and_loadable():
    """import_streaming's stand-ins (rgpt_dist/data/mds.py): streaming loads without transformers (1.6 s
    per process), nothing of the stand-ins stays in sys.modules, and transformers loads whole afterwards;
    where transformers is already loaded, streaming gets the real classes."""
    import subprocess
    import sys

    check = ("import sys; from rgpt_dist.data.mds import import_streaming; import_streaming(); "
             "assert not [m for m in sys.modules if m.split('.')[0] == 'transformers'], 'transformers was loaded'; "
             "import transformers; from transformers import AutoModelForCausalLM, BatchEncoding; "
             "assert BatchEncoding.__module__ == 'transformers.tokenization_utils_base'")
    real = ("import transformers, sys; from rgpt_dist.data.mds import import_streaming; import_streaming(); "
            "import streaming.base.dataloader as d; assert d.BatchEncoding is transformers.BatchEncoding")
    for code in (check, real):
        subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_cleanup_removes_only_what_no_process_uses(tmp_path):
    """A segment a live process maps (its file closed) or holds open stays; a leaked one goes. streaming's
    own cleanup would remove all three, a live job's included."""
    import os
    import subprocess
    import sys
    from rgpt_dist.data.streaming import cleanup_stale_state
    mapped, held, leaked = (f"/dev/shm/99999{i}_{n}" for i, n in ((0, "locals"), (1, "barrier"), (2, "locals")))
    for path in (mapped, held, leaked):
        with open(path, "wb") as f:
            f.write(b"\0" * 64)
    holder = ("import mmap, sys, time\n"
              f"f = open({mapped!r}, 'r+b'); m = mmap.mmap(f.fileno(), 0); f.close()\n"
              f"g = open({held!r}, 'rb')\n"
              "print('READY', flush=True); time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        cleanup_stale_state()
        assert os.path.exists(mapped) and os.path.exists(held) and not os.path.exists(leaked)
    finally:
        proc.kill()
        proc.wait()
    cleanup_stale_state()
    assert not any(os.path.exists(p) for p in (mapped, held, leaked))
