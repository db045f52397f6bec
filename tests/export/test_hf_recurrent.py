"""The Hugging Face trust_remote_code RecurrentGPT (rgpt_dist/export/hf_recurrent) against the native
model: logits and loss at several depths, cached generation per KV strategy, cache bytes, load-time
overrides, and loading without rgpt_dist importable."""
import json
import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from rgpt_dist.config import RecurrentGPTConfig
from rgpt_dist.export.hf_recurrent_writer import write_hf_recurrent
from rgpt_dist.registry import build_model

CFG = dict(vocab_size=300, pad_vocab_multiple=128, block_size=64, d_model=48, n_head=4,
           n_pre=1, n_rec=2, n_coda=1, n_loops=3)
R = CFG["n_loops"]
STRATEGIES = ("full", "first", "last", "average")


@pytest.fixture(scope="module")
def native():
    """A random RecurrentGPT moved off its init (biases, LayerNorms, gate bias non-trivial; large
    enough that greedy decoding does not repeat one token), vocabulary 300 padded to 384."""
    cfg = RecurrentGPTConfig(**CFG)
    model = build_model(cfg, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
        model.recurrence.gate_out.bias.normal_(0.0, 1.0, generator=g)
    return model.eval(), cfg


@pytest.fixture(scope="module")
def export_dir(native, hf_env, tmp_path_factory):
    model, cfg = native
    return write_hf_recurrent(model.state_dict(), cfg, tmp_path_factory.mktemp("hf") / "rgpt_export")


def load(path, **overrides):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, **overrides).eval()


def prompt(B=2, T=7, seed=3):
    return torch.randint(0, CFG["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def greedy(model, ids, n, **kw):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_scores=True, **kw)


def test_export_layout_and_tied_head(export_dir, native):
    model, cfg = native
    names = set(load_file(export_dir / "model.safetensors"))
    assert names == set(model.state_dict())  # native names, head stored once as embed.wte.weight
    with safe_open(str(export_dir / "model.safetensors"), "pt") as f:
        assert f.metadata()["format"] == "pt"
    config = json.loads((export_dir / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration_rgpt.RecurrentGPTHFConfig",
                                  "AutoModelForCausalLM": "modeling_rgpt.RecurrentGPTForCausalLM"}
    assert not (export_dir / "tokenizer.json").exists()
    hf = load(export_dir)
    assert hf.lm_head.weight.data_ptr() == hf.embed.wte.weight.data_ptr()
    assert {n for n, _ in hf.named_parameters()} == set(model.state_dict())
    c = hf.config
    assert (c.r_eval, c.kv_strategy, c.vocab_size, c.padded_vocab_size) == (R, "full", 300, 384)
    assert (c.max_position_embeddings, c.n_positions, c.hidden_size, c.num_attention_heads) == (64, 64, 48, 4)
    assert c.num_hidden_layers == 1 + 2 * R + 1
    assert (c.eos_token_id, c.bos_token_id, c.tie_word_embeddings, c.use_cache) == (50256, 50256, True, True)


def test_save_pretrained_round_trip_keeps_the_tie(export_dir, tmp_path):
    hf = load(export_dir, r_eval=2)
    hf.save_pretrained(tmp_path / "resaved")
    assert set(load_file(tmp_path / "resaved" / "model.safetensors")) == {n for n, _ in hf.named_parameters()}
    assert (tmp_path / "resaved" / "modeling_rgpt.py").exists()
    again = load(tmp_path / "resaved")
    assert again.config.r_eval == 2 and again.lm_head.weight.data_ptr() == again.embed.wte.weight.data_ptr()
    ids = prompt()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, hf(ids).logits, atol=0, rtol=0)


@pytest.mark.parametrize("r", [1, R, 2 * R])
def test_logits_and_loss_match_native(export_dir, native, r):
    model, cfg = native
    hf = load(export_dir, r_eval=r)
    assert hf.config.r_eval == r and hf.config.num_hidden_layers == 2 + 2 * r
    ids = prompt(T=20)
    labels = ids.clone()
    labels[0, 5:9] = -100
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)  # native: unshifted
    targets[targets == -100] = -1                                                     # and -1 ignored
    with torch.no_grad():
        expected = model(ids, targets, r=r)
        out = hf(ids, labels=labels)
        uncached = hf(ids, use_cache=False)
    torch.testing.assert_close(out.logits, expected.logits[..., :cfg.vocab_size], atol=1e-5, rtol=0)
    torch.testing.assert_close(uncached.logits, out.logits, atol=0, rtol=0)
    assert out.logits.shape == (2, 20, 300) and out.logits.abs().max() > 0.1
    torch.testing.assert_close(out.loss, expected.loss, atol=1e-5, rtol=0)
    assert uncached.past_key_values is None


def test_greedy_generate_cached_equals_uncached(export_dir):
    hf = load(export_dir)
    ids = prompt()
    cached, recomputed = greedy(hf, ids, 12, use_cache=True), greedy(hf, ids, 12, use_cache=False)
    assert type(cached.past_key_values).__name__ == "RecurrentGPTCache"
    assert torch.equal(cached.sequences, recomputed.sequences)
    for a, b in zip(cached.scores, recomputed.scores):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    new = cached.sequences[:, ids.shape[1]:]
    assert new.shape[1] == 12 and all(len(set(row.tolist())) > 2 for row in new)  # not one repeated token


def test_every_strategy_generates_and_compressed_ones_differ_from_full(export_dir):
    ids = prompt()
    runs = {s: greedy(load(export_dir, kv_strategy=s), ids, 10) for s in STRATEGIES}
    full = runs["full"]
    for s in ("first", "last", "average"):
        run = runs[s]
        assert run.sequences.shape == full.sequences.shape
        assert run.past_key_values.strategy == s
        # the prompt, prefilled in one call, is exact; later tokens see compressed history
        torch.testing.assert_close(run.scores[0], full.scores[0], atol=1e-5, rtol=0)
        assert max((a - b).abs().max().item() for a, b in zip(run.scores[1:], full.scores[1:])) > 1e-3
    # first / last / average compress differently from each other too
    assert not torch.allclose(runs["first"].scores[1], runs["last"].scores[1], atol=1e-4)
    assert not torch.allclose(runs["average"].scores[1], runs["last"].scores[1], atol=1e-4)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cached_logits_match_native_cache(export_dir, native, strategy):
    """The native model's KV cache (rgpt_dist.models.kv_cache), fed the same tokens, gives the same logits."""
    model, cfg = native
    if not hasattr(model, "make_cache"):
        pytest.skip("the native model has no KV cache yet")
    ids = prompt()
    run = greedy(load(export_dir, kv_strategy=strategy), ids, 6)
    cache = model.make_cache(strategy, R)
    feed = [ids] + [run.sequences[:, i:i + 1] for i in range(ids.shape[1], run.sequences.shape[1] - 1)]
    with torch.no_grad():
        for step, x in enumerate(feed):
            logits = model(x, cache=cache).logits[:, -1, :cfg.vocab_size]
            torch.testing.assert_close(logits, run.scores[step], atol=1e-5, rtol=0)


@pytest.mark.parametrize("strategy,dtype", [(s, torch.float32) for s in STRATEGIES] + [("full", torch.bfloat16)])
def test_cache_bytes_are_analytic(export_dir, strategy, dtype):
    hf = load(export_dir, kv_strategy=strategy, r_eval=4, dtype=dtype)
    ids, n = prompt(B=2, T=7), 5
    cache = greedy(hf, ids, n).past_key_values
    tokens = ids.shape[1] + n - 1  # the last new token is never fed back
    layers = CFG["n_pre"] + CFG["n_coda"] + CFG["n_rec"] * (4 if strategy == "full" else 1)
    assert cache.get_seq_length() == tokens
    assert cache.nbytes() == layers * 2 * 2 * tokens * CFG["d_model"] * torch.finfo(dtype).bits // 8


def test_left_padded_batch_matches_unpadded_rows(export_dir):
    hf = load(export_dir, kv_strategy="average")
    a, b = prompt(B=1, T=7, seed=5), prompt(B=1, T=4, seed=6)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=a.dtype), b], 1)])
    mask = torch.ones_like(batch)
    mask[1, :3] = 0
    with torch.no_grad():
        padded = hf.generate(batch, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                             pad_token_id=0)
    for row, single in zip(padded, (a, b)):
        alone = greedy(hf, single, 8).sequences[0]
        assert torch.equal(row[-8:], alone[-8:])


def test_load_time_overrides_and_errors(export_dir):
    from transformers import AutoConfig
    hf = load(export_dir, r_eval=8, kv_strategy="average")
    assert (hf.config.r_eval, hf.config.kv_strategy) == (8, "average")
    assert hf.make_cache().r == 8 and hf.make_cache().strategy == "average"
    with pytest.raises(ValueError, match="kv_strategy must be one of full, first, last, average, got 'bogus'"):
        load(export_dir, kv_strategy="bogus")
    with pytest.raises(ValueError, match="r_eval .* must be an integer >= 0, got -1"):
        load(export_dir, r_eval=-1)
    with pytest.raises(ValueError, match="r_eval"):
        AutoConfig.from_pretrained(export_dir, trust_remote_code=True, r_eval=1.5)
    # per call: num_steps, and a cache is tied to its depth
    ids = prompt()
    with torch.no_grad():
        out = hf(ids, num_steps=2)
        assert out.past_key_values.r == 2
        with pytest.raises(ValueError, match="made for depth r=2, got r=8"):
            hf(ids[:, :1], past_key_values=out.past_key_values)
        with pytest.raises(ValueError, match="num_steps|r_eval"):
            hf(ids, num_steps=-2)


def test_loads_without_rgpt_dist_importable(export_dir, native, tmp_path):
    """A fresh interpreter whose sys.path holds only the standard library and site-packages, with
    site-packages' .pth files (the editable rgpt_dist install) not processed."""
    model, cfg = native
    ids = prompt()
    script = textwrap.dedent(f"""
        import sys
        sys.path.append({sysconfig.get_paths()["purelib"]!r})
        import importlib.util
        assert importlib.util.find_spec("rgpt_dist") is None, "rgpt_dist is importable"
        import torch
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained({str(export_dir)!r}, trust_remote_code=True).eval()
        assert not any(m.startswith("rgpt_dist") for m in sys.modules)
        ids = torch.tensor({ids.tolist()!r})
        with torch.no_grad():
            logits = model(ids).logits
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                                 pad_token_id=0)
        save_file({{"logits": logits.contiguous(), "seq": seq}}, "out.safetensors")
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = load_file(tmp_path / "out.safetensors")
    with torch.no_grad():
        expected = model(ids).logits[..., :cfg.vocab_size]
    torch.testing.assert_close(out["logits"], expected, atol=1e-5, rtol=0)
    assert out["seq"].shape == (2, ids.shape[1] + 4)


def test_writer_rejects_a_mismatched_state_dict(native, tmp_path):
    model, cfg = native
    sd = dict(model.state_dict())
    sd.pop("recurrence.gate_pre.weight")
    sd["extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"missing \['recurrence.gate_pre.weight'\], unexpected \['extra.weight'\]"):
        write_hf_recurrent(sd, cfg, tmp_path / "bad")
    with pytest.raises(ValueError, match="kv_strategy"):
        write_hf_recurrent(model.state_dict(), cfg, tmp_path / "bad", kv_strategy="bogus")


def test_beam_search_and_continuing_from_a_returned_cache(export_dir):
    from transformers import DynamicCache
    hf = load(export_dir)
    ids = prompt()
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        beams = [hf.generate(ids, num_beams=3, use_cache=c, **kw) for c in (True, False)]
        assert torch.equal(*beams)  # reorder_cache of the RecurrentGPTCache
        first = greedy(hf, ids, 8)
        seq = first.sequences
        more = hf.generate(seq, attention_mask=torch.ones_like(seq), past_key_values=first.past_key_values,
                           max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert torch.equal(more, greedy(hf, ids, 12).sequences)
        # an empty generic cache handed in by a caller is replaced by a RecurrentGPTCache
        assert torch.equal(hf.generate(ids, past_key_values=DynamicCache(), **kw), seq)


def test_bf16_autocast_forward(export_dir):
    """The gated update mixes bf16 matmul outputs with the fp32 residual stream under autocast."""
    model, ids = load(export_dir), prompt()
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(ids, use_cache=False).logits
    assert (got.float() - ref).abs().max() < 0.25 * ref.abs().max()
