"""lm-evaluation-harness on exported checkpoints (rgpt_dist/eval/harness.py), offline, against our own
multiple-choice accuracy: through `run_lm_eval`, through the real `lm_eval` command line (from a
foreign cwd), at several depths R* of a RecurrentGPT export, and from the native model's logits.

lm-eval's per-doc log-likelihoods (log_samples) must equal own_accuracy's bitwise: a tokenisation or
whitespace slip, an off-by-one in the scored positions or a wrong normalisation changes them."""
import csv
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from rgpt_dist.config import GPT2Config, RecurrentGPTConfig
from rgpt_dist.eval.harness import (EXAMPLE_DATA, EXAMPLE_TASK, TASKS_DIR, HarnessError, depth_sweep,
                                    run_lm_eval, write_results)
from rgpt_dist.eval.scoring import encode_pair, load_task_items, own_accuracy
from rgpt_dist.registry import build_model
from tests.helpers.hf import isolated_hf

N_ITEMS = 35
METRICS = ("acc", "acc_norm", "acc_bytes")
DENSE = GPT2Config(vocab_size=50257, block_size=128, d_model=64, n_head=4, n_layer=2)
RECURRENT = RecurrentGPTConfig(vocab_size=50257, pad_vocab_multiple=128, block_size=128, d_model=64, n_head=4,
                               n_pre=1, n_rec=1, n_coda=1, n_loops=3)


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """No Hub or dataset downloads; HF caches (remote code copies included) in a temporary folder;
    one torch thread (2 shared cores: two threads are ~15x slower here under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with isolated_hf(tmp_path_factory.mktemp("hf_home")) as home:
        yield home
    torch.set_num_threads(threads)


def perturbed(cfg, seed):
    """A random model moved off its init, so the choices' log-likelihoods are well separated."""
    model = build_model(cfg, seed=seed).eval()
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
        if hasattr(model, "recurrence"):
            model.recurrence.gate_out.bias.normal_(0.0, 1.0, generator=g)
    return model


@pytest.fixture(scope="module")
def dense(offline, tmp_path_factory):
    """(export dir, native model) of a tiny random GPT-2, exported as rgpt-export does (GPT2LMHeadModel)."""
    from rgpt_dist.export.hf_dense import write_hf_gpt2
    from rgpt_dist.export.tokenizer_files import write_tokenizer

    out = tmp_path_factory.mktemp("dense") / "hf"
    out.mkdir()
    model = perturbed(DENSE, seed=0)
    write_hf_gpt2(model.state_dict(), DENSE, out, dtype=torch.float32)
    write_tokenizer(out, model_max_length=DENSE.block_size)
    return out, model


@pytest.fixture(scope="module")
def dense_runs(dense):
    """lm-eval through run_lm_eval (per-doc samples logged) and our own computation, same export."""
    hf_dir, _ = dense
    return run_lm_eval(hf_dir, [EXAMPLE_TASK], log_samples=True), own_accuracy(hf_dir, EXAMPLE_TASK)


def logged_lls(samples):
    """doc_id -> per-choice log-likelihoods lm-eval logged (its samples file holds them as str(float),
    which round-trips a float exactly)."""
    return {s["doc_id"]: [float(ll) for ll, _greedy in s["filtered_resps"]] for s in samples}


def assert_same_as_lm_eval(task_metrics, samples, own):
    assert task_metrics["n"] == own["n"] == N_ITEMS
    lls = logged_lls(samples)
    assert sorted(lls) == list(range(N_ITEMS))
    for item in own["items"]:
        assert item["lls"] == lls[item["doc_id"]], f"doc {item['doc_id']}"  # bitwise
    per_doc = {s["doc_id"]: s for s in samples}
    for m in METRICS:
        assert [it[m] for it in own["items"]] == [per_doc[i][m] for i in range(N_ITEMS)], m
        assert task_metrics[m] == own[m], m  # exactly, not approximately


def test_run_lm_eval_equals_own_accuracy(dense_runs):
    result, own = dense_runs
    metrics = result["tasks"][EXAMPLE_TASK]
    assert set(METRICS) | {"acc_stderr", "acc_norm_stderr", "n"} <= set(metrics)
    assert result["model_args"]["trust_remote_code"] is False and result["r_eval"] is None
    assert_same_as_lm_eval(metrics, result["samples"][EXAMPLE_TASK], own)
    # the data are scored as lm-eval builds requests: " " + choice after the question, and a question's
    # trailing whitespace is part of the question string lm-eval passes (moved to the continuation later)
    doc25 = next(s for s in result["samples"][EXAMPLE_TASK] if s["doc_id"] == 25)
    assert doc25["arguments"][0] == ("# Python\ndef square(x):\n", "    return x * x")
    # not a degenerate pattern: a random model is right sometimes, wrong sometimes, and the three
    # normalisations pick differently on some items (non-ASCII choices make bytes != characters)
    assert 0 < own["acc"] < 1
    preds = {m: [it[p] for it in own["items"]] for m, p in (("acc", "pred"), ("acc_norm", "pred_norm"),
                                                           ("acc_bytes", "pred_bytes"))}
    assert preds["acc"] != preds["acc_norm"] != preds["acc_bytes"]  # a swapped normalisation would show


def test_own_accuracy_from_a_native_logits_fn(dense, dense_runs):
    """The callable route on the native rgpt model (project tiktoken tokenizer) picks what the HF export
    picks; a differently initialised model picks differently, so the comparisons above can fail."""
    _, model = dense
    _, own_hf = dense_runs

    def logits_fn(model):
        def fn(ids):
            with torch.no_grad():
                return model(ids).logits
        return fn

    native = own_accuracy(logits_fn(model), EXAMPLE_DATA)
    for a, b in zip(native["items"], own_hf["items"]):
        assert a["lls"] == pytest.approx(b["lls"], abs=1e-4)
        margin = sorted(b["lls"])[-1] - sorted(b["lls"])[-2]
        if margin > 1e-3:
            assert a["pred"] == b["pred"]
    other = own_accuracy(logits_fn(perturbed(DENSE, seed=1)), EXAMPLE_DATA)
    assert [it["pred"] for it in other["items"]] != [it["pred"] for it in own_hf["items"]]
    # the target delimiter matters: without lm-eval's " " the scores are different numbers
    no_space = own_accuracy(logits_fn(model), EXAMPLE_DATA, target_delimiter="", limit=4)
    assert all(a["lls"] != pytest.approx(b["lls"], abs=1e-3) for a, b in zip(no_space["items"], own_hf["items"]))


def test_lm_eval_command_line_offline_from_another_cwd(dense, dense_runs, offline, tmp_path):
    """`python -m lm_eval ... --include_path <bundled tasks>`, run from a folder unrelated to the
    repository with downloads disabled: the JSONL is found next to its YAML, and the scores are ours."""
    hf_dir, _ = dense
    _, own = dense_runs
    out = tmp_path / "lm_eval_out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               HF_HOME=str(offline / "cli"), HF_MODULES_CACHE=str(offline / "cli" / "modules"))
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={hf_dir}",
           "--tasks", EXAMPLE_TASK, "--include_path", str(TASKS_DIR), "--device", "cpu", "--batch_size", "1",
           "--output_path", str(out), "--log_samples"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [results_file] = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    [samples_file] = glob.glob(str(out / "**" / f"samples_{EXAMPLE_TASK}_*.jsonl"), recursive=True)
    raw = json.loads(open(results_file).read())["results"][EXAMPLE_TASK]
    for m in METRICS:
        assert raw[f"{m},none"] == own[m], m
    samples = [json.loads(line) for line in open(samples_file)]
    assert_same_as_lm_eval({"n": len(samples), **{m: raw[f"{m},none"] for m in METRICS}}, samples, own)


def test_depth_sweep_passes_r_eval_to_a_recurrent_export(offline, tmp_path):
    """Each R* reaches the trust_remote_code model (the scores change with depth) and lm-eval matches our
    computation at every depth; the results table has one row per task x depth."""
    from rgpt_dist.export.hf_looped_writer import write_hf_looped
    from rgpt_dist.export.tokenizer_files import write_tokenizer

    hf_dir = write_hf_looped(perturbed(RECURRENT, seed=0).state_dict(), RECURRENT, tmp_path / "hf")
    write_tokenizer(hf_dir, model_max_length=RECURRENT.block_size)
    depths = [1, 3]
    runs = depth_sweep(hf_dir, [EXAMPLE_TASK], depths, log_samples=True)
    assert [r["r_eval"] for r in runs] == depths
    assert [r["model_args"]["r_eval"] for r in runs] == depths
    assert runs[0]["model_args_str"].endswith(",trust_remote_code=True,use_cache=False,r_eval=1")
    own = {}
    for run in runs:
        own[run["r_eval"]] = own_accuracy(hf_dir, EXAMPLE_TASK, model_args_extra={"r_eval": run["r_eval"]})
        assert_same_as_lm_eval(run["tasks"][EXAMPLE_TASK], run["samples"][EXAMPLE_TASK], own[run["r_eval"]])
    assert [it["lls"] for it in own[1]["items"]] != [it["lls"] for it in own[3]["items"]]

    paths = write_results(runs, tmp_path / "report")
    rows = list(csv.DictReader(open(paths["csv"])))
    assert [(r["task"], r["r_eval"]) for r in rows] == [(EXAMPLE_TASK, "1"), (EXAMPLE_TASK, "3")]
    for row, run in zip(rows, runs):
        assert float(row["acc"]) == run["tasks"][EXAMPLE_TASK]["acc"]
        assert float(row["acc_norm"]) == run["tasks"][EXAMPLE_TASK]["acc_norm"] and row["n"] == str(N_ITEMS)
    report = json.loads(paths["json"].read_text())
    assert [r["r_eval"] for r in report["runs"]] == depths and "samples" not in report["runs"][0]
    assert sorted(p.name for p in paths["samples"]) == [f"samples_{EXAMPLE_TASK}_r1.jsonl",
                                                        f"samples_{EXAMPLE_TASK}_r3.jsonl"]
    assert sum(1 for _ in open(paths["samples"][0])) == N_ITEMS


def test_unknown_task_and_misuse_give_clear_errors(dense):
    hf_dir, _ = dense
    with pytest.raises(HarnessError, match=r"unknown lm-eval task.*'rgpt_exampel'.*did you mean: rgpt_example"):
        run_lm_eval(hf_dir, ["rgpt_exampel"])
    with pytest.raises(HarnessError, match="no `r_eval`.*RecurrentGPT export"):
        depth_sweep(hf_dir, [EXAMPLE_TASK], [1, 2])
    with pytest.raises(HarnessError, match="no config.json"):
        run_lm_eval(hf_dir.parent, [EXAMPLE_TASK])
    with pytest.raises(HarnessError, match="neither a bundled task"):
        own_accuracy(lambda ids: None, "no_such_task")


def test_encode_pair_follows_lm_eval_whitespace_rules(encoding):
    enc = encoding.encode_ordinary
    # trailing whitespace of the context moves to the continuation; the split is of the whole encoding
    ctx, cont = encode_pair(enc, "def f():\n", "    return 1", prefix_token_id=50256)
    assert ctx == enc("def f():") and ctx + cont == enc("def f():\n    return 1")
    ctx, cont = encode_pair(enc, "The capital of France is", " Paris", prefix_token_id=50256)
    assert (ctx, cont) == (enc("The capital of France is"), enc(" Paris"))
    # an empty context is the prefix token (unless the continuation starts with it)
    assert encode_pair(enc, "", " Paris", prefix_token_id=50256) == ([50256], enc(" Paris"))


def test_bundled_data_resolve_next_to_the_yaml_from_any_cwd(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("rgpt_example_local_data", TASKS_DIR / "rgpt_example" / "local_data.py")
    local_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(local_data)
    monkeypatch.chdir(tmp_path)
    ds = local_data.load_local_jsonl({"test": "rgpt_example.jsonl"},
                                     config_source=str(TASKS_DIR / "rgpt_example" / "rgpt_example.yaml"),
                                     version=1.0, pretrained="ignored")
    assert list(ds) == ["test"] and len(ds["test"]) == N_ITEMS
    assert ds["test"][0] == load_task_items(EXAMPLE_TASK)[0]
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        local_data.load_local_jsonl({"test": "missing.jsonl"}, config_source=str(tmp_path / "x.yaml"))
    items = load_task_items(EXAMPLE_TASK)
    assert len(items) == N_ITEMS and all(0 <= it["gold"] < len(it["choices"]) <= 4 for it in items)


def test_scoring_forwards_build_no_cache_and_generation_still_caches(offline, tmp_path):
    """The model lm-eval loads from hf_model_args (use_cache=False): a scoring forward returns no
    KV cache (none is allocated), while generate(use_cache=True), as lm-eval's generate_until calls
    it, still decodes with one and equals the native cached generation."""
    from transformers import AutoModelForCausalLM

    from rgpt_dist.eval.harness import hf_model_args
    from rgpt_dist.export.hf_looped_writer import write_hf_looped
    from rgpt_dist.models.generate import generate

    native = perturbed(RECURRENT, seed=0)
    hf_dir = write_hf_looped(native.state_dict(), RECURRENT, tmp_path / "hf")
    args = hf_model_args(hf_dir)
    assert args["use_cache"] is False and hf_model_args(hf_dir, {"use_cache": True})["use_cache"] is True
    hf = AutoModelForCausalLM.from_pretrained(args.pop("pretrained"), **args).eval()
    idx = torch.randint(0, RECURRENT.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert hf(idx).past_key_values is None
        seq = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=5, do_sample=False,
                          pad_token_id=0, use_cache=True)
    assert torch.equal(seq, generate(native, idx, 5, strategy="full"))


@pytest.mark.parametrize("edit,message", [
    ({"r_eval": 10 ** 9}, "r_eval=1000000000: this model has no depth beyond 48"),  # 16 x R = 3
    ({"n_loops": 10 ** 9, "r_eval": 10 ** 9}, "n_loops=1000000000 must be <= 1024"),
])
def test_an_export_whose_r_eval_is_far_beyond_its_training_depth_is_refused(edit, message, offline, tmp_path,
                                                                             capsys):
    """A crafted config.json must not make rgpt-eval run 10^9 recurrence steps per token: r_eval is
    bounded by 16 x the trained depth R (and R by training's 1024); explicit depths within it still run."""
    from launcher.eval import main
    from rgpt_dist.export.hf_looped_writer import write_hf_looped
    from rgpt_dist.export.tokenizer_files import write_tokenizer

    hf_dir = write_hf_looped(build_model(RECURRENT, seed=0).state_dict(), RECURRENT, tmp_path / "exp" / "hf")
    write_tokenizer(hf_dir, model_max_length=RECURRENT.block_size)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, **edit}))
    start = time.perf_counter()
    assert main(["lm-eval", str(tmp_path / "exp"), "--limit", "2", "--out", str(tmp_path / "out")]) == 2
    assert time.perf_counter() - start < 60
    assert message in capsys.readouterr().err
