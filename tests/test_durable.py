"""rgpt_dist.durable: atomic replacement of files and whole directories."""
import os
import threading

from rgpt_dist.durable import atomic_write_text, swap_dir


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "latest"
    atomic_write_text(target, "step_1")
    atomic_write_text(target, "step_2")
    assert target.read_text() == "step_2" and os.listdir(tmp_path) == ["latest"]


def test_swap_dir_never_leaves_the_target_missing(tmp_path):
    """A reader polling the target during many swaps always finds a complete tree (old or new)."""
    dst = tmp_path / "export"
    dst.mkdir()
    (dst / "v").write_text("0")
    seen, done = [], threading.Event()

    def watch():
        while not done.is_set():
            try:
                seen.append((dst / "v").read_text())
            except FileNotFoundError:
                seen.append(None)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(1, 200):
            new = tmp_path / f".export.partial-{i}"
            new.mkdir()
            (new / "v").write_text(str(i))
            swap_dir(new, dst)
    finally:
        done.set()
        watcher.join()
    assert (dst / "v").read_text() == "199" and sorted(os.listdir(tmp_path)) == ["export"]
    assert None not in seen and len(seen) > 10


def test_swap_dir_into_a_new_place(tmp_path):
    new = tmp_path / "new"
    new.mkdir()
    (new / "f").write_text("x")
    swap_dir(new, tmp_path / "out")
    assert (tmp_path / "out" / "f").read_text() == "x" and not new.exists()
