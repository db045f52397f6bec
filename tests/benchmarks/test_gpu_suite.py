"""Smoke tests of benchmarks/gpu_suite.py, the one-shot H200 script, on CPU (`--quick`): every section
leaves results or a reason in the JSON, a failing or hanging section does not stop the others, and the
script imports nothing beyond torch and rgpt_dist (what a bare CUDA torch install on the GPU machine has).
Timings are not asserted."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ["environment", "train", "time_ratio", "generation", "compile", "generation_compiled"]
# Not on a bare CUDA torch install: the suite must run with each of them unimportable (PyYAML it needs:
# the config package reads YAML; the device image has it, as transformers requires it).
ABSENT = ("numpy", "deepspeed", "megatron", "streaming", "transformers", "wandb", "tiktoken")


def run_suite(tmp_path: Path, *args: str, absent: tuple = ABSENT, rc: int = 0) -> tuple[dict, str]:
    code = (f"import runpy, sys\nfor m in {absent!r}: sys.modules[m] = None\n"
            f"sys.argv = ['gpu_suite.py', *{list(args)!r}]\n"
            "runpy.run_path('benchmarks/gpu_suite.py', run_name='__main__')")
    env = {**os.environ, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == rc, proc.stderr[-3000:]
    return json.loads((tmp_path / "gpu_suite.json").read_text()), proc.stdout


def test_quick_runs_every_section_and_survives_a_failing_one(tmp_path):
    report, out = run_suite(tmp_path, "--quick", "--fail-section", "time_ratio")
    assert report["meta"]["finished"] and report["meta"]["quick"]
    sections = report["sections"]
    assert list(sections) == SECTIONS
    for name, entry in sections.items():
        assert entry["status"] in ("ok", "skipped", "error"), name
        assert entry["results"] or entry.get("reason") or entry.get("error"), name
    # the injected failure is recorded with what the section measured before it, and the rest ran
    assert sections["time_ratio"]["status"] == "error" and "--fail-section" in sections["time_ratio"]["error"]
    assert sections["time_ratio"]["results"]["flop_normalised_ratio"] > 0
    assert [sections[s]["status"] for s in SECTIONS if s != "time_ratio"] == ["ok"] * 5
    env = sections["environment"]["results"]
    assert env["peak_flops"] > 0 and set(env["sdpa"]) == {"flash_attention", "efficient_attention",
                                                          "cudnn_attention", "math"}
    arms = sections["train"]["results"]["arms"]
    for arm in ("dense/none", "recurrent/none/r=fixed", "recurrent/recurrence/r=sampled", "dense/recurrence"):
        assert arms[arm]["tokens_per_s"] > 0 and 0 < arms[arm]["mfu"] <= arms[arm]["hfu"], arm
    assert arms["recurrent/recurrence/r=fixed"]["hfu"] > arms["recurrent/recurrence/r=fixed"]["mfu"]  # recompute
    assert "recurrent/none/r=fixed/autocast" in arms  # results or the error, either is recorded
    gen = sections["generation"]["results"]["arms"]
    assert set(gen) == {"dense/full", "recurrent/full", "recurrent/first", "recurrent/last", "recurrent/average",
                        "dense/no-cache", "recurrent/no-cache"}
    assert gen["dense/full"]["ratio_to_dense"] == 1.0 and gen["recurrent/average"]["ms"] > 0
    compiled = sections["compile"]["results"]
    assert compiled["speedup"] > 0 and compiled["compiled"]["graph_breaks"] == 0, compiled["compiled"]
    gen_compiled = sections["generation_compiled"]["results"]
    assert set(gen_compiled["arms"]) == {"dense/full", "recurrent/full", "recurrent/first", "recurrent/last",
                                         "recurrent/average"}
    assert gen_compiled["graph_breaks"] == 0 and gen_compiled["frames_compiled"] <= 2 * 5
    for needle in ("## GPU suite", "| train arm |", "FLOP-normalised", "torch.compile", "| generation arm |",
                   "- time_ratio: **error**"):
        assert needle in out


def test_the_alarm_ends_a_hanging_section_and_the_budget_skips_the_rest(tmp_path):
    report, _ = run_suite(tmp_path, "--quick", "--sections", "environment,train", "--hang-section", "environment",
                          "--budget-s", "3")
    env, train = report["sections"]["environment"], report["sections"]["train"]
    assert env["status"] == "error" and "BudgetExceeded" in env["error"] and env["results"]["sdpa"]
    assert train["status"] == "skipped" and "budget spent" in train["reason"]
    assert report["meta"]["finished"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_without_cuda_every_section_but_environment_is_skipped(tmp_path):
    report, _ = run_suite(tmp_path, "--sections", "environment,train,compile", "--budget-s", "60")
    sections = report["sections"]
    assert sections["environment"]["status"] == "ok"
    assert sections["environment"]["results"]["cuda_available"] is False
    for name in ("train", "compile"):
        assert sections[name]["status"] == "skipped" and "CUDA is not available" in sections[name]["reason"]


def test_without_torch_the_json_says_so(tmp_path):
    report, _ = run_suite(tmp_path, "--quick", absent=("torch",), rc=1)
    assert "torch is not importable" in report["meta"]["error"]
