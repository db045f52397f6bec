"""rgpt-export on real checkpoints written by the trainer under torchrun (ZeRO 0/2/3, tp = 2, bf16)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from rgpt_dist.config import load_config
from rgpt_dist.checkpoints.consolidate import ExportError, consolidate
from rgpt_dist.checkpoints.native import load_native
from rgpt_dist.models.spec import spec_for
from rgpt_dist.registry import build_model
from tests.helpers.dist import ROOT
from tests.helpers.replay import replay

pytestmark = pytest.mark.slow


def initial_weights(run_dir):
    cfg = load_config(run_dir / "config.yaml")
    return build_model(cfg.model, seed=cfg.train.seed).state_dict()


@pytest.mark.parametrize("name", ["zero3", "tp2-bf16"])
def test_sharded_checkpoints_consolidate_to_the_full_model_bitwise(runs, name):
    """ZeRO-3 partitions and tp = 2 shards (bf16 training: the fp32 masters) merge back into the
    tp = 1 model the run started from (a misplaced shard would differ by ~0.02, the lr moves 1e-30).
    Under bf16 DeepSpeed builds the fp32 masters from the bf16-cast model: the start is the
    seeded init rounded to bf16."""
    c = consolidate(runs[name])
    expected = initial_weights(runs[name])
    if "bf16" in name:
        expected = {k: v.bfloat16().float() for k, v in expected.items()}
    assert c.step == 2 and "fp32 master" in c.source
    assert set(c.state_dict) == set(expected)
    for k, v in expected.items():
        assert c.state_dict[k].dtype == torch.float32 and (c.state_dict[k] - v).abs().max() < 1e-28, k


def test_consolidated_weights_are_what_the_engine_held(runs):
    """ZeRO-2: the module weights DeepSpeed saved with the checkpoint agree with the consolidated ones,
    which come from another source, the fp32 master partitions (ZeRO-0 has no masters: the export
    takes the module weights themselves, and test_zero0_export_is_a_plain_torch_replay checks them)."""
    c = consolidate(runs["zero2-trained"])
    assert c.step == 4 and c.source.startswith("fp32 master weights")
    module = torch.load(next(c.tag_dir.glob("mp_rank_00_model_states.pt")), weights_only=False)["module"]
    init = initial_weights(runs["zero2-trained"])
    moved = 0
    for k, v in module.items():
        assert torch.equal(v.float(), c.state_dict[k]), k
        moved += not torch.equal(v.float(), init[k])
    assert moved > len(module) // 2, "training did not move the weights: the test would be vacuous"


def assert_export_is_replay(run_dir, out_dir):
    """The exported (native) weights of a ZeRO-0 run and the trainer's logged losses against `replay`.
    DeepSpeed's step and the replay are two float32 paths of one computation (the gradients' sums in
    another order, which AdamW amplifies where gradients are near zero), so they are
    held to tests/helpers/tolerance.py's bound: 4x the float32 replay's distance from its float64 twin
    plus 4 ulps of the values, on the host at hand. A stale, missing or misapplied step moves weights
    by ~1e-3."""
    from rgpt_dist.export.exporter import export
    from tests.helpers.runs import losses, records
    from tests.helpers.tolerance import fp32_bound, max_abs

    model, meta = load_native(export(run_dir, out_dir) / "native")
    assert meta["step"] == 4 and meta["weights"].startswith("module weights (float32)"), meta
    exported = model.state_dict()
    twin32, twin64 = replay(run_dir), replay(run_dir, torch.float64)
    (weights, replayed), (weights64, replayed64) = (twin32.weights, twin32.losses), (twin64.weights, twin64.losses)
    logged = losses(records(run_dir))
    assert [s for s, _ in logged] == [1, 2, 3, 4]
    for (step, loss), loss32, loss64 in zip(logged, replayed, replayed64):  # the trainer's mean in float32
        assert abs(loss - loss32) <= fp32_bound(abs(loss32 - loss64), abs(loss64)), (step, loss, loss32, loss64)
    init = initial_weights(run_dir)
    assert set(exported) == set(weights) == set(init)
    bound = fp32_bound(max(max_abs(weights[k], weights64[k]) for k in weights),
                       max(v.abs().max().item() for v in weights64.values()))
    # the float32 replay is 1.6e-5 from its float64 twin here (AdamW's step amplifies near-zero gradients'
    # rounding), so the bound is ~6.6e-5: still 15x below what one wrong step does, and every tensor moved
    # ~100x it (7e-3 measured)
    moved = min((weights[k] - init[k]).abs().max().item() for k in init)
    assert moved > 10 * bound, f"a tensor barely moved ({moved}, bound {bound}): the comparison would be vacuous"
    worst = max(max_abs(exported[k], weights[k]) for k in weights)
    assert worst <= bound, (worst, bound)


def test_zero0_export_is_a_plain_torch_replay(runs, tmp_path):
    """ZeRO-0 keeps no fp32 masters: the export takes the module weights DeepSpeed saved, and they must
    be the weights the run's 4 steps produce, computed again without DeepSpeed (`replay`)."""
    assert_export_is_replay(runs["zero0-trained"], tmp_path / "exp")


def test_bf16_export_takes_the_fp32_masters(runs):
    """After bf16 training steps the consolidated weights are DeepSpeed's fp32 masters: finer than
    bf16, and rounding them gives the bf16 module weights saved beside them."""
    c = consolidate(runs["bf16-trained"])
    module = torch.load(c.tag_dir / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    finer = 0
    for k, v in module.items():
        assert v.dtype == torch.bfloat16 and torch.equal(c.state_dict[k].bfloat16(), v), k
        finer += not torch.equal(c.state_dict[k], v.float())
    assert finer > len(module) // 2


def export_cli(*args):
    return subprocess.run([sys.executable, "-m", "launcher.export", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})


def test_cli_writes_native_and_hf_and_refuses_to_overwrite(runs, tmp_path):
    out = tmp_path / "exp"
    done = export_cli(runs["zero3"], out)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "hf", "native"]
    record = json.loads((out / "export.json").read_text())
    assert record["step"] == 2 and "ZeRO-3" in record["weights"]
    model, meta = load_native(out / "native")
    assert meta["step"] == 2
    expected = initial_weights(runs["zero3"])
    assert all((model.state_dict()[k] - v).abs().max() < 1e-28 for k, v in expected.items())
    again = export_cli(runs["zero3"], out)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert export_cli(runs["zero3"], out, "--overwrite").returncode == 0
    assert not list(tmp_path.glob(".exp.rgpt-export-*"))  # the staging directory (rgpt_dist.safe_paths)


def test_dense_export_is_a_native_gpt2(runs, tmp_path):
    """The dense model loads as transformers' GPT2LMHeadModel (no remote code) with the same logits and
    loss, and its tokenizer matches tiktoken's GPT-2 encoding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2LMHeadModel

    from rgpt_dist.data.tokenizer import get_encoding

    out = tmp_path / "dense"
    assert export_cli(runs["dense"], out).returncode == 0
    native, _ = load_native(out / "native")
    hf = AutoModelForCausalLM.from_pretrained(out / "hf").eval()
    assert isinstance(hf, GPT2LMHeadModel)
    text = "def export(checkpoint, out):\n    return consolidate(checkpoint)  # naïve ✓\n"
    ids = torch.tensor([get_encoding().encode_ordinary(text)])
    assert AutoTokenizer.from_pretrained(out / "hf")(text, return_tensors="pt")["input_ids"].equal(ids)
    with torch.no_grad():
        mine = native(ids[:, :-1], ids[:, 1:])
        theirs = hf(ids, labels=ids)  # HF shifts the labels inside
    vocab = native.cfg.vocab_size
    assert (mine.logits[..., :vocab] - theirs.logits[:, :-1]).abs().max() < 1e-5
    assert abs(mine.loss.item() - theirs.loss.item()) < 1e-5


def test_incomplete_and_corrupted_checkpoints_are_refused(runs, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(runs["zero0-trained"], run)
    tag = next((run / "checkpoints").glob("step_*"))
    model_file = tag / "mp_rank_00_model_states.pt"
    model_file.write_bytes(model_file.read_bytes()[:-10] + b"0123456789")
    done = export_cli(run, tmp_path / "out")
    assert done.returncode == 2 and "corrupted" in done.stderr and "mp_rank_00_model_states.pt" in done.stderr
    (tag / "checksums.json").unlink()
    done = export_cli(run, tmp_path / "out")
    assert done.returncode == 2 and "incomplete" in done.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(ExportError, match="does not exist"):
        consolidate(tmp_path / "nowhere")


@pytest.mark.parametrize("name", ["zero3", "tp2-bf16", "poisson-tp2", "rrt-zero3"])
def test_recurrent_export_round_trip_native_equals_hf(runs, name, hf_env, tmp_path):
    """From ZeRO-3 and tp = 2 checkpoints of every looped family: the HF trust_remote_code model gives
    the native export's logits at R* = 1, R and 2R (RRT: at most R; fp32)."""
    from transformers import AutoModelForCausalLM

    from rgpt_dist.export.exporter import export

    out = export(runs[name], tmp_path / name)
    native, _ = load_native(out / "native")
    R, deepest = native.cfg.n_loops, spec_for(native.cfg).max_eval_depth(native.cfg)
    ids = torch.randint(0, native.cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    for r in sorted({1, R, deepest or 2 * R}):
        hf = AutoModelForCausalLM.from_pretrained(out / "hf", trust_remote_code=True, r_eval=r).eval()
        with torch.no_grad():
            mine = native(ids, r=r).logits[..., :native.cfg.vocab_size]
            theirs = hf(ids, use_cache=False).logits
        assert (mine - theirs).abs().max() < 1e-5, (name, r)


def test_lm_eval_on_a_recurrent_export_equals_our_own_scoring(runs, tmp_path):
    """`lm_eval --model hf --model_args pretrained=<export>,trust_remote_code=True --tasks rgpt_example
    --include_path <tasks>` runs offline on the export of a trained RecurrentGPT, and its accuracy is
    what `rgpt-eval lm-eval` computes itself; the depth sweep reaches the model."""
    import glob

    from rgpt_dist.eval.harness import TASKS_DIR

    out = tmp_path / "exp"
    assert export_cli(runs["zero3"], out).returncode == 0
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf_home"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
           f"pretrained={out / 'hf'},trust_remote_code=True", "--tasks", "rgpt_example", "--include_path",
           str(TASKS_DIR), "--device", "cpu", "--batch_size", "1", "--output_path", str(tmp_path / "lm")]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [results] = glob.glob(str(tmp_path / "lm" / "**" / "results_*.json"), recursive=True)
    theirs = json.loads(open(results).read())["results"]["rgpt_example"]
    done = subprocess.run([sys.executable, "-m", "launcher.eval", "lm-eval", str(out), "--depths", "1,4",
                           "--out", str(tmp_path / "ours")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ours = {r["r_eval"]: r["tasks"]["rgpt_example"]
            for r in json.loads((tmp_path / "ours" / "lm_eval_results.json").read_text())["runs"]}
    for m in ours.values():
        assert m["acc"] == m["own_acc"] and m["acc_norm"] == m["own_acc_norm"]
    assert ours[4]["acc"] == theirs["acc,none"]  # R* = R is the export's default depth


def test_competitor_exports_curve_and_lm_eval(runs, tmp_path):
    """rgpt-eval on the competitors' exports: the early-exit curve of Poisson depth runs to 2R; RRT's
    stops at R (its adapters) and a deeper request fails naming the limit; the lm-eval depth sweep
    reaches the Poisson export and lm-eval's accuracy equals our own scoring."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf_home"), "OMP_NUM_THREADS": "1"}

    def rgpt_eval(*args):
        return subprocess.run([sys.executable, "-m", "launcher.eval", *map(str, args)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)

    for name, depths in (("poisson-tp2", list(range(7))), ("rrt-zero3", list(range(4)))):
        assert export_cli(runs[name], tmp_path / name).returncode == 0
        done = rgpt_eval("curve", tmp_path / name, "--out", tmp_path / f"{name}-curve", "--batches", "2")
        assert done.returncode == 0, done.stderr[-3000:]
        rows = json.loads((tmp_path / f"{name}-curve" / "early_exit.json").read_text())
        assert [row["depth"] for row in rows] == depths and all(row["loss"] > 0 for row in rows)
    done = rgpt_eval("curve", tmp_path / "rrt-zero3", "--out", tmp_path / "deep", "--depths", "0,4")
    assert done.returncode == 2 and "RRT has no depth beyond r=3" in done.stderr and "[4]" in done.stderr
    done = rgpt_eval("lm-eval", tmp_path / "poisson-tp2", "--depths", "1,3", "--limit", "12", "--out", tmp_path / "lm")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "lm" / "lm_eval_results.json").read_text())["runs"]
    assert [r["r_eval"] for r in results] == [1, 3]
    for run in results:
        m = run["tasks"]["rgpt_example"]
        assert m["acc"] == m["own_acc"] and m["n"] == 12
