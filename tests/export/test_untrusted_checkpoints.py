"""Shared checkpoints cannot run code: a payload in a model-states or optimizer-states file (checksums
recomputed, as the author of a shared run would) fires in none of rgpt-export, rgpt-eval on a run,
or the trainer's resume; each refuses naming the file. A fuzz of checkpoint directories gives a
clean refusal or a correct load."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from rgpt_dist.checkpoints.consolidate import ExportError, consolidate
from tests.helpers.dist import ROOT
from tests.helpers.hostile import poison_pt, rewrite_checksums

pytestmark = pytest.mark.slow

MODEL_STATES = "mp_rank_00_model_states.pt"
OPTIM_STATES = "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"


def cli(module, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=600)


def poisoned(run, tmp_path, file):
    """A copy of `run` whose newest checkpoint's `file` carries a payload creating tmp_path/fired."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    tag = max((copy / "checkpoints").glob("step_*"))
    poison_pt(tag / file, tmp_path / "fired")
    rewrite_checksums(tag)
    return copy, tag


@pytest.mark.parametrize("file", [MODEL_STATES, OPTIM_STATES])
def test_export_and_eval_refuse_a_payload_naming_the_file(runs, tmp_path, file):
    run, tag = poisoned(runs["bf16-trained"], tmp_path, file)
    export = cli("launcher.export", run, tmp_path / "out")
    assert export.returncode == 2 and f"{tag.name}/{file}: refusing to load" in export.stderr, export.stderr
    assert "--trust-checkpoint" in export.stderr and not (tmp_path / "out").exists()
    curve = cli("launcher.eval", "curve", run, "--out", tmp_path / "eval", "--batches", "1")
    assert curve.returncode == 2 and f"{file}: refusing to load" in curve.stderr, curve.stderr
    assert not (tmp_path / "fired").exists() and not (tmp_path / "eval").exists()
    if file == MODEL_STATES:  # the payload is real: trusting the checkpoint runs it
        assert cli("launcher.export", run, tmp_path / "out", "--trust-checkpoint").returncode == 0
        assert (tmp_path / "fired").exists()


def test_resume_refuses_a_payload_and_trains_nothing(runs, tmp_path):
    run, tag = poisoned(runs["zero2-trained"], tmp_path, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    metrics = (run / "metrics.jsonl").read_text()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "launcher.train", str(run / "config.yaml"), "train.max_steps=6", f"log.run_dir={run}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    out = done.stdout + done.stderr
    assert done.returncode != 0 and f"{tag.name}/zero_pp_rank_0_mp_rank_00_optim_states.pt: refusing to load" in out, out[-3000:]
    assert "exitcode  : 2" in out  # the workers' own status: refused, not crashed
    assert not (tmp_path / "fired").exists()
    assert (run / "metrics.jsonl").read_text() == metrics and max((run / "checkpoints").glob("step_*")) == tag


# ---------------------------------------------------------------------------------------- fuzz
def _mutate(tag, rng):
    """One random damage to a checkpoint directory: bytes flipped, truncated, a file removed, added
    or replaced by another, the record emptied or garbled; half the time the attacker then
    recomputes checksums.json so that the loaders themselves see the damage."""
    files = sorted(p for p in tag.iterdir() if p.name != "checksums.json")
    target = rng.choice(files)
    kind = rng.randrange(7)
    data = target.read_bytes()
    if kind == 0:
        pos = rng.randrange(len(data))
        target.write_bytes(data[:pos] + bytes([data[pos] ^ (1 << rng.randrange(8))]) + data[pos + 1:])
    elif kind == 1:
        target.write_bytes(data[:rng.randrange(len(data))])
    elif kind == 2:
        target.unlink()
    elif kind == 3:
        (tag / rng.choice(["extra.pt", "zero_pp_rank_9_mp_rank_00_optim_states.pt", "mp_rank_01_model_states.pt"])
         ).write_bytes(rng.choice(files).read_bytes())
    elif kind == 4:
        target.write_bytes(rng.choice(files).read_bytes())
    elif kind == 5:
        (tag / "checksums.json").write_text(rng.choice(["{}", "[]", "null", "{\"a\": 1}", "\x00\x01"]))
        return
    elif target.suffix != ".pt":  # the JSON run config (run_config.json): valid JSON, not a config
        target.write_text(rng.choice(['{"model": 1}', "[]", "null", '{"model": {"d_model": "x"}}']))
    else:  # rewrite a value inside the pickled state: the structure a crafted file could have
        state = torch.load(target, map_location="cpu", weights_only=False)
        if isinstance(state, dict) and state:
            key = rng.choice(sorted(state, key=str))
            state[key] = rng.choice([None, 0, "x", [], {}, torch.zeros(3), {"module": {}}])
            torch.save(state, target)
    if rng.random() < 0.5:
        rewrite_checksums(tag)


def _hang(*_):
    raise TimeoutError("consolidation hung")


def test_fuzzed_checkpoints_give_a_clean_refusal_or_a_correct_load(runs, tmp_path):
    """200 mutations of a ZeRO-2 bf16 checkpoint: consolidate (what rgpt-export and rgpt-eval use)
    raises ExportError with a message, or returns exactly the model's parameter names and shapes;
    never another exception, a hang or a file outside the checkpoint."""
    reference = consolidate(runs["bf16-trained"]).state_dict
    src = max((runs["bf16-trained"] / "checkpoints").glob("step_*"))
    rng = random.Random(7)
    outcomes = {"refused": 0, "loaded": 0}
    signal.signal(signal.SIGALRM, _hang)
    for i in range(200):
        tag = tmp_path / f"m{i}" / src.name
        shutil.copytree(src, tag)
        _mutate(tag, rng)
        signal.alarm(60)
        try:
            state = consolidate(tag).state_dict
            assert sorted(state) == sorted(reference), f"mutation {i}"
            assert all(state[k].shape == reference[k].shape for k in state), f"mutation {i}"
            outcomes["loaded"] += 1
        except ExportError as e:
            assert str(e), f"mutation {i}: empty message"
            outcomes["refused"] += 1
        finally:
            signal.alarm(0)
        assert os.listdir(tmp_path / f"m{i}") == [src.name], f"mutation {i} wrote beside the checkpoint"
        shutil.rmtree(tmp_path / f"m{i}")
        assert os.listdir(tmp_path) == [], f"mutation {i} left files"
    assert outcomes["refused"] > 100, outcomes
    print(json.dumps(outcomes))
