"""metrics.jsonl after a kill mid-append: the torn last line (or a corrupt one anywhere) is dropped
with a warning naming file:line, never a traceback, and the killed run resumes from its checkpoint
with the losses of an uninterrupted run."""
import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from rgpt_dist.train.metrics import MetricsSink, read_metrics
from tests.helpers.dist import ROOT
from tests.helpers.runs import COMMON, QUICKSTART, records

LINES = [json.dumps({"step": s, "loss": 10.0 - s}) for s in (1, 2, 3, 4)]


def _cfg(run_dir):
    return SimpleNamespace(log=SimpleNamespace(run_dir=str(run_dir), wandb="disabled"))


def test_a_torn_last_line_is_dropped_with_a_warning_naming_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(LINES) + '\n{"step": 5, "loss": 3.')  # killed inside json.dumps' output
    with pytest.warns(UserWarning, match=rf"{path}:5: torn last line") as caught:
        got = read_metrics(path)
    assert len(caught) == 1
    assert [r["step"] for _, r in got] == [1, 2, 3, 4] and [line for line, _ in got] == LINES


def test_corrupt_lines_anywhere_are_dropped_never_raised(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"\n".join([LINES[0].encode(), b"{not json", b"\xff\xfe binary", b"[1, 2]", b'{"step": "3"}',
                                 b"", LINES[3].encode(), b"[" * 100_000, b""]))
    with pytest.warns(UserWarning) as caught:
        got = read_metrics(path)
    assert [r["step"] for _, r in got] == [1, 4]
    messages = [str(w.message) for w in caught]
    assert [m.split(": ")[0] for m in messages] == [f"{path}:{n}" for n in (2, 3, 4, 5, 8)]
    assert all("corrupt record" in m for m in messages)  # terminated lines: corrupt, not torn
    assert read_metrics(tmp_path / "missing.jsonl") == []


def test_resume_cut_and_start_repair_the_file_atomically(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(LINES) + '\n{"step": 5, "lo')
    with pytest.warns(UserWarning, match=":5: torn last line"):
        sink = MetricsSink(_cfg(tmp_path), is_main=True)  # a fresh start cuts the torn tail off
    assert path.read_text() == "\n".join(LINES) + "\n"
    sink.log({"step": 5, "loss": float("nan"), "stats": [1.0, float("inf")]})
    assert json.loads(path.read_text().splitlines()[-1]) == {"step": 5, "loss": None, "stats": [1.0, None]}
    sink.resume_at(3)
    assert path.read_text() == "\n".join(LINES[:3]) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temporary left behind


def test_an_unterminated_but_complete_last_record_is_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(LINES))  # killed between the record and its newline
    MetricsSink(_cfg(tmp_path), is_main=True)
    assert path.read_text() == "\n".join(LINES) + "\n"


def test_an_unreadable_wandb_run_id_starts_a_new_one(tmp_path):
    from rgpt_dist.train.metrics import _wandb_run_id
    first = _wandb_run_id(tmp_path)
    assert _wandb_run_id(tmp_path) == first
    (tmp_path / "wandb_run_id").write_bytes(b"\x00\x00")
    with pytest.warns(UserWarning, match="does not hold a wandb run id"):
        second = _wandb_run_id(tmp_path)
    assert second != first and (tmp_path / "wandb_run_id").read_text() == second


# ---- a real run: killed mid-append after its step-3 checkpoint, restarted --------------------------
ARGS = ["parallel.zero_stage=0", "train.max_steps=6", "checkpoint.every_steps=3", "checkpoint.keep_last=3",
        "eval.every_steps=0"]


def _train(run_dir, dataset) -> str:
    """One rank under torchrun, as tests.helpers.runs.train, returning stdout and stderr (the
    resume message and the metrics warning)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m",
           "launcher.train", QUICKSTART, *COMMON, f"data.paths=[{dataset}]", f"log.run_dir={run_dir}", *ARGS]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".venv" / "torch_extensions"))}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _trajectory(recs):
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"], r["r"]) for r in recs if "loss" in r]


@pytest.mark.slow
def test_a_run_killed_mid_append_resumes_from_its_checkpoint_with_the_same_losses(dataset, tmp_path):
    """Two launches: the uninterrupted reference run, whose directory is then put in the state a kill
    inside step 5's append leaves (checkpoint of step 3; records 1-4; step 5's record half written; no
    step-6 checkpoint), and the restart, which must resume at step 3 and end as the reference did."""
    run = tmp_path / "run"
    _train(run, dataset)
    reference = _trajectory(records(run))
    assert [s for s, *_ in reference] == [1, 2, 3, 4, 5, 6]
    shutil.rmtree(run / "checkpoints" / "step_00000006")
    (run / "checkpoints" / "latest").write_text("step_00000003")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    step5 = next(line for line in lines if json.loads(line)["step"] == 5)
    kept = [line for line in lines if json.loads(line)["step"] <= 4]
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in kept) + step5[:len(step5) // 2])

    output = _train(run, dataset)
    assert f"resumed from {run / 'checkpoints' / 'step_00000003'} at step 3" in output, output[-3000:]
    assert f"{run / 'metrics.jsonl'}:{len(kept) + 1}: torn last line" in output
    resumed = _trajectory(records(run))
    assert [s for s, *_ in resumed] == [1, 2, 3, 4, 5, 6]  # every step once: the torn one rewritten
    assert resumed == reference  # bitwise: JSON floats round-trip exactly
