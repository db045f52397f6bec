"""The Hugging Face trust_remote_code export of every prelude/core/coda family (rgpt_dist/export/
hf_looped + the shipped native modules) against the native model: the shipped code is the trainer's
own, logits and loss at several depths, cached generation per KV strategy, cache bytes, padding,
load-time overrides, and loading without rgpt_dist importable."""
import ast
import copy
import importlib
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rgpt_dist.models.config import LoopedConfig
from rgpt_dist.export.hf_looped_writer import write_hf_looped
from rgpt_dist.models.spec import families, spec_for
from rgpt_dist.registry import build_model
from tests.helpers.hf import greedy, load_remote as load
from tests.helpers.tolerance import fp32_bound, logits_bound, max_abs

LOOPED = sorted(n for n, s in families().items() if issubclass(s.config, LoopedConfig))
CFG = dict(vocab_size=300, pad_vocab_multiple=128, block_size=64, d_model=48, n_head=4, n_pre=1, n_rec=2, n_coda=1,
           n_loops=3)
EXTRA = {"relaxed": dict(lora_rank=4, lora_alpha=4.0), "poisson": dict(k_max=2), "mor": dict(router_alpha=1.0)}
# MoR's routed updates are small (g <= alpha): a larger perturbation keeps its greedy stream varied
PERTURB = {"mor": 0.2}
R = CFG["n_loops"]
STRATEGIES = ("full", "first", "last", "average")


@pytest.fixture(scope="module", params=LOOPED)
def native(request):
    """A random model moved off its init (large enough that greedy decoding does not repeat one
    token), vocabulary 300 padded to 384."""
    cfg = spec_for(request.param).config(**CFG, **EXTRA.get(request.param, {}))
    model = build_model(cfg, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * PERTURB.get(request.param, 0.1))
    return model.eval(), cfg


@pytest.fixture(scope="module")
def export_dir(native, hf_env, tmp_path_factory):
    model, cfg = native
    # transformers keys remote-code modules by the directory's name: one name per family
    return write_hf_looped(model.state_dict(), cfg, tmp_path_factory.mktemp("hf") / f"{cfg.family}_export")


def prompt(B=2, T=7, seed=3):
    return torch.randint(0, CFG["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def deepest(cfg):
    return spec_for(cfg).max_eval_depth(cfg) or 2 * R


def _code_lines(source: str) -> list[str]:
    """The source without its import statements (what must be the same in the export)."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            lines[node.lineno - 1:node.end_lineno] = [None] * (node.end_lineno - node.lineno + 1)
    return [line for line in lines if line is not None]


def test_the_export_ships_the_trainers_modules_verbatim_but_for_imports(export_dir, native):
    _, cfg = native
    module = spec_for(cfg).model.split(":")[0]
    shipped = {p.name for p in export_dir.glob("*.py")}
    assert {"configuration_rgpt.py", "cache_rgpt.py", "modeling_rgpt.py", "layers.py", "kv_cache.py", "looped.py",
            f"{cfg.family}_model.py"} <= shipped
    for name in ("layers", "kv_cache", "looped", "noise", f"{cfg.family}.model"):
        source = Path(importlib.import_module(f"rgpt_dist.models.{name}" if name != "noise" else "rgpt_dist.noise")
                      .__file__).read_text()
        exported = (export_dir / f"{name.replace('.', '_')}.py").read_text()
        assert _code_lines(exported) == _code_lines(source), name
    for path in export_dir.glob("*.py"):  # nothing of the package is imported
        assert "rgpt_dist" not in "".join(line for line in path.read_text().splitlines()
                                          if line.lstrip().startswith(("import ", "from "))), path.name
    cls = spec_for(cfg).model.split(":")[1]
    assert f"from .{module.split('.')[-2]}_model import {cls} as NativeModel" in (export_dir / "modeling_rgpt.py").read_text()


def test_export_layout_and_config(export_dir, native):
    model, cfg = native
    assert set(load_file(export_dir / "model.safetensors")) == {f"model.{k}" for k in model.state_dict()}
    config = json.loads((export_dir / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration_rgpt.RGPTConfig",
                                  "AutoModelForCausalLM": "modeling_rgpt.RGPTForCausalLM"}
    assert config["family"] == cfg.family and set(config["native_fields"]) == set(cfg.to_dict())
    hf = load(export_dir)
    assert hf.model.head.wte[0] is hf.get_input_embeddings()  # tied by construction
    c = hf.config
    assert (c.r_eval, c.kv_strategy, c.vocab_size, c.padded_vocab_size) == (R, "full", 300, 384)
    assert (c.max_position_embeddings, c.n_positions, c.hidden_size, c.num_attention_heads) == (64, 64, 48, 4)
    assert c.num_hidden_layers == 1 + 2 * R + 1 and (c.eos_token_id, c.use_cache) == (50256, True)


def test_save_pretrained_round_trip(export_dir, native, tmp_path):
    hf = load(export_dir, r_eval=2)
    hf.save_pretrained(tmp_path / "resaved")  # the same directory name for every family (module docstring)
    assert (tmp_path / "resaved" / "modeling_rgpt.py").exists()
    again = load(tmp_path / "resaved")
    assert type(again.model).__name__ == spec_for(native[1]).model.split(":")[1]
    assert again.config.r_eval == 2
    ids = prompt()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, hf(ids).logits, atol=0, rtol=0)


def test_logits_and_loss_match_native(export_dir, native):
    model, cfg = native
    ids = prompt(T=20)
    labels = ids.clone()
    labels[0, 5:9] = -100
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)  # native: unshifted
    targets[targets == -100] = -1                                                     # and -1 ignored
    for r in sorted({0, 1, R, deepest(cfg)}):
        hf = load(export_dir, r_eval=r)
        assert hf.config.num_hidden_layers == 2 + 2 * r
        with torch.no_grad():
            expected = model(ids, targets, r=r)
            loss64 = copy.deepcopy(model).double()(ids, targets, r=r).loss
            out, uncached = hf(ids, labels=labels), hf(ids, use_cache=False)
        # two float32 paths of one computation: within tests/helpers/tolerance.py's bound of the native
        # model's distance to its float64 twin
        assert max_abs(out.logits, expected.logits[..., :cfg.vocab_size]) <= logits_bound(model, ids, cfg.vocab_size, r=r)
        torch.testing.assert_close(uncached.logits, out.logits, atol=0, rtol=0)
        assert max_abs(out.loss, expected.loss) <= fp32_bound(max_abs(expected.loss, loss64), loss64.abs().item())
        assert out.logits.shape == (2, 20, 300) and uncached.past_key_values is None


def test_greedy_generate_cached_equals_uncached(export_dir, native):
    hf = load(export_dir)
    ids = prompt()
    cached, recomputed = greedy(hf, ids, 12, use_cache=True), greedy(hf, ids, 12, use_cache=False)
    assert type(cached.past_key_values).__name__ == "RGPTCache"
    assert torch.equal(cached.sequences, recomputed.sequences)
    bound = logits_bound(native[0], cached.sequences[:, :-1], CFG["vocab_size"])  # tests/helpers/tolerance.py
    assert max(max_abs(a, b) for a, b in zip(cached.scores, recomputed.scores)) <= bound
    new = cached.sequences[:, ids.shape[1]:]
    assert new.shape[1] == 12 and all(len(set(row.tolist())) > 1 for row in new)  # not one repeated token


def test_compressed_strategies_are_exact_on_the_prompt_and_differ_after(export_dir, native):
    """Every compressed strategy the family's cache offers (MoR: `first`, its KV sharing)."""
    ids = prompt()
    runs = {s: greedy(load(export_dir, kv_strategy=s), ids, 6) for s in spec_for(native[1]).kv_strategies}
    assert len(runs) > 1
    bound = logits_bound(native[0], ids, CFG["vocab_size"])  # the prompt's logits: two float32 paths
    for s in set(runs) - {"full"}:
        assert runs[s].past_key_values.strategy == s
        assert max_abs(runs[s].scores[0], runs["full"].scores[0]) <= bound
        assert max((a - b).abs().max().item() for a, b in zip(runs[s].scores[1:], runs["full"].scores[1:])) > 1e-4


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cached_logits_match_the_native_cache(export_dir, native, strategy):
    model, cfg = native
    if strategy not in spec_for(cfg).kv_strategies:
        with pytest.raises(ValueError, match=f"kv_strategy='{strategy}': this model's cache offers full, first only"):
            load(export_dir, kv_strategy=strategy)
        return
    ids = prompt()
    run = greedy(load(export_dir, kv_strategy=strategy), ids, 5)
    cache = model.make_cache(strategy, R)
    feed = [ids] + [run.sequences[:, i:i + 1] for i in range(ids.shape[1], run.sequences.shape[1] - 1)]
    bound = logits_bound(model, ids, cfg.vocab_size)  # a float32 path's error scale on the prompt
    with torch.no_grad():
        for step, x in enumerate(feed):
            logits = model(x, cache=cache).logits[:, -1, :cfg.vocab_size]
            assert max_abs(logits, run.scores[step]) <= bound, step
    hf_cache = run.past_key_values  # bytes: the analytic count (bf16 and fp32 alike)
    layers = CFG["n_pre"] + CFG["n_coda"] + CFG["n_rec"] * (R if strategy == "full" else 1)
    # MoR: the routes (B, 1, T, 1) of each step (full) or of the first (first)
    routes = (R if strategy == "full" else 1) * 2 * (ids.shape[1] + 4) * 4 if cfg.family == "mor" else 0
    assert hf_cache.nbytes() == layers * 2 * 2 * (ids.shape[1] + 4) * CFG["d_model"] * 4 + routes


def shared_strategy(cfg) -> str:
    """`average` where the family's cache offers it (its padded decoding is the hardest), else the
    first compressed strategy it offers (MoR: `first`)."""
    return next(s for s in ("average", "first", "last", "full") if s in spec_for(cfg).kv_strategies)


def test_left_padded_batch_matches_unpadded_rows(export_dir, native):
    hf = load(export_dir, kv_strategy=shared_strategy(native[1]))
    a, b = prompt(B=1, T=7, seed=5), prompt(B=1, T=4, seed=6)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=a.dtype), b], 1)])
    mask = torch.ones_like(batch)
    mask[1, :3] = 0
    with torch.no_grad():
        padded = hf.generate(batch, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                             pad_token_id=0)
    for row, single in zip(padded, (a, b)):
        assert torch.equal(row[-8:], greedy(hf, single, 8).sequences[0, -8:])


def test_load_time_overrides_and_errors(export_dir, native):
    from transformers import AutoConfig
    _, cfg = native
    shared = shared_strategy(cfg)
    hf = load(export_dir, r_eval=2, kv_strategy=shared)
    assert (hf.config.r_eval, hf.config.kv_strategy) == (2, shared)
    assert hf.make_cache().r == 2 and hf.make_cache().strategy == shared
    with pytest.raises(ValueError, match="kv_strategy must be one of full, first, last, average, got 'bogus'"):
        load(export_dir, kv_strategy="bogus")
    with pytest.raises(ValueError, match="r_eval .* must be an integer >= 0, got -1"):
        load(export_dir, r_eval=-1)
    with pytest.raises(ValueError, match="r_eval"):
        AutoConfig.from_pretrained(export_dir, trust_remote_code=True, r_eval=1.5)
    if spec_for(cfg).max_eval_depth(cfg) is not None:  # RRT: no adapters beyond R
        with pytest.raises(ValueError, match=f"r_eval={R + 1}: this model has no depth beyond {R}"):
            load(export_dir, r_eval=R + 1)
    ids = prompt()
    with torch.no_grad():
        out = hf(ids, num_steps=1)
        assert out.past_key_values.r == 1
        with pytest.raises(ValueError, match="made for depth r=1, got r=2"):
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
    assert max_abs(out["logits"], expected) <= logits_bound(model, ids, cfg.vocab_size)
    assert out["seq"].shape == (2, ids.shape[1] + 4)


def test_writer_rejects_a_mismatched_state_dict(native, tmp_path):
    model, cfg = native
    sd = dict(model.state_dict())
    victim = sorted(sd)[-1]
    sd.pop(victim)
    sd["extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=rf"missing \['{victim}'\], unexpected \['extra.weight'\]"):
        write_hf_looped(sd, cfg, tmp_path / "bad")
    with pytest.raises(ValueError, match="kv_strategy"):
        write_hf_looped(model.state_dict(), cfg, tmp_path / "bad", kv_strategy="bogus")


def test_beam_search_and_continuing_from_a_returned_cache(export_dir):
    from transformers import DynamicCache
    hf = load(export_dir)
    ids = prompt()
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        beams = [hf.generate(ids, num_beams=3, use_cache=c, **kw) for c in (True, False)]
        assert torch.equal(*beams)  # reorder_cache over the cache's DynamicLayers
        first = greedy(hf, ids, 6)
        seq = first.sequences
        more = hf.generate(seq, attention_mask=torch.ones_like(seq), past_key_values=first.past_key_values,
                           max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert torch.equal(more, greedy(hf, ids, 9).sequences)
        # an empty generic cache handed in by a caller is replaced by an RGPTCache
        assert torch.equal(hf.generate(ids, past_key_values=DynamicCache(), **kw), seq)


def test_bf16_autocast_forward(export_dir):
    model, ids = load(export_dir), prompt()
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(ids, use_cache=False).logits
    assert (got.float() - ref).abs().max() < 0.25 * ref.abs().max()
