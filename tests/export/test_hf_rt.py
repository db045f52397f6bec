"""The layerwise Recurrent Transformer's Hugging Face export (issue 27): rgpt_dist.export.hf_looped_writer
writes RT as it writes RLT, shipping rgpt_dist/models/rt/model.py and tiled.py verbatim but for their
imports; the adapter's cache holds each layer's persistent pairs in transformers' DynamicLayers
(RT.make_cache(store=)), and the untied head is stored as embed.unembed. Against the native model (tiny
rt-debug as the authors' block: ALiBi, untied head, the tiled prefill; and with RoPE; fp32,
moved off the init): logits and loss bitwise, cached greedy generate() (a prompt, then tokens) against a
recompute loop written here and the native cached generate, the cache's per-position decoding in fp64
against the whole-sequence forward (one token at a time and a chunk at once), beam search (the cache
reorders), batch selection and crop (RT carries no state beyond its K/V, so both are exact), and what
the export refuses. transformers 5.x: tests/export/test_transformers5.py runs RT's export there."""
import ast
import copy
import importlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rgpt_dist.export.hf_looped_writer import write_hf_looped
from rgpt_dist.export.remote_code import trust_remote_code
from rgpt_dist.models.generate import generate
from rgpt_dist.models.spec import spec_for
from rgpt_dist.registry import build_model
from tests.helpers.hf import greedy as hf_greedy, load_remote as load

SPEC = spec_for("rt")
SMALL = dict(vocab_size=300, pad_vocab_multiple=128, block_size=64)
# a tied head (tie_embeddings) is every looped family's, tested there; tied, this tiny RT's greedy stream
# repeats its input token (measured at perturbations 0.3 and 1.0), too degenerate to compare decoding
MODELS = {"alibi": {}, "rope": {"pos_encoding": "rope"}}
PERTURB = 0.3  # as RLT's: greedy streams of several distinct tokens
FILES = {"configuration_rgpt.py", "cache_rgpt.py", "modeling_rgpt.py", "rt_model.py", "rt_tiled.py", "kv_cache.py",
         "layers.py", "block_options.py"}


@pytest.fixture(scope="module", params=list(MODELS))
def rt(request, hf_env, tmp_path_factory):
    """(native model, its config, the export directory, the export loaded), one per model."""
    cfg = SPEC.config(**{**SPEC.flavours["rt-debug"], **SMALL, **MODELS[request.param]})
    model = build_model(cfg, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * PERTURB)
    # transformers keys remote-code modules by the directory's name: one name per model
    out = write_hf_looped(model.state_dict(), cfg, tmp_path_factory.mktemp("hf") / f"rt_{request.param}_export")
    return model.eval(), cfg, out, load(out)


def prompt(B=2, T=7, seed=3):
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def recompute_greedy(model, ids, n, vocab):
    """Greedy decoding by the whole-sequence forward (the tiled prefill) on every prefix: tokens (B, T + n)."""
    with torch.no_grad():
        for _ in range(n):
            last = model(ids).logits[:, -1, :vocab]                    # (B, V)
            ids = torch.cat([ids, last.argmax(-1, keepdim=True)], 1)
    return ids


def _code_lines(source: str) -> list[str]:
    """The source without its import statements (what must be the same in the export)."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            lines[node.lineno - 1:node.end_lineno] = [None] * (node.end_lineno - node.lineno + 1)
    return [line for line in lines if line is not None]


def test_the_export_ships_rts_own_modules_and_its_head(rt):
    model, cfg, out, hf = rt
    assert {p.name for p in out.glob("*.py")} == FILES
    for module, file in (("rgpt_dist.models.rt.model", "rt_model.py"), ("rgpt_dist.models.rt.tiled", "rt_tiled.py")):
        source = Path(importlib.import_module(module).__file__).read_text()
        assert _code_lines((out / file).read_text()) == _code_lines(source), file
    for path in out.glob("*.py"):  # nothing of the package is imported
        assert "rgpt_dist" not in "".join(line for line in path.read_text().splitlines()
                                          if line.lstrip().startswith(("import ", "from "))), path.name
    assert "from .rt_model import RT as NativeModel" in (out / "modeling_rgpt.py").read_text()
    stored = load_file(out / "model.safetensors")
    assert set(stored) == {f"model.{k}" for k in model.state_dict()}
    assert ("model.embed.unembed.weight" in stored) == (not cfg.tie_embeddings)
    config = json.loads((out / "config.json").read_text())
    assert config["family"] == "rt" and config["r_eval"] is None and config["num_hidden_layers"] == cfg.n_layer == 3
    assert config.get("tie_word_embeddings", True) is cfg.tie_embeddings
    assert (hf.config.has_depth, hf.config.kv_strategies, hf.config.prefill) == (False, ["full"], "tiled")
    wte, head = hf.get_input_embeddings(), hf.model.head.wte[0]
    assert (head is wte) is cfg.tie_embeddings and hf.get_output_embeddings() is None
    assert torch.equal(head.weight, (model.embed.wte if cfg.tie_embeddings else model.embed.unembed).weight)
    # a new input embedding moves a tied head with it, never an untied one
    clone = copy.deepcopy(hf)
    new, before = copy.deepcopy(wte), clone.model.head.wte[0]
    clone.set_input_embeddings(new)
    assert clone.get_input_embeddings() is new and clone.model.head.wte[0] is (new if cfg.tie_embeddings else before)
    assert trust_remote_code(out) is True  # rgpt-eval's default policy runs this checkout's code


def test_logits_and_loss_equal_the_native_model(rt):
    model, cfg, _, hf = rt
    ids = prompt(T=13)
    labels = ids.clone()
    labels[0, 4:7] = -100
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)  # native: unshifted,
    targets[targets == -100] = -1                                                     # -1 ignored
    with torch.no_grad():
        expected = model(ids, targets)
        out, uncached = hf(ids, labels=labels), hf(ids, use_cache=False)
    assert out.logits.shape == (2, 13, 300) and out.logits.abs().max() > 0.1
    # the same modules (the tiled prefill, with or without storing the persistent pairs): bitwise; the loss
    # is taken over the real vocabulary here, the padded one natively
    torch.testing.assert_close(out.logits, expected.logits[..., :300], atol=0, rtol=0)
    torch.testing.assert_close(out.loss, expected.loss, atol=0, rtol=1e-6)
    torch.testing.assert_close(uncached.logits, out.logits, atol=0, rtol=0)
    assert type(out.past_key_values).__name__ == "RGPTCache" and uncached.past_key_values is None
    assert out.past_key_values.get_seq_length() == 13 and len(out.past_key_values.layers) == cfg.n_layer


@pytest.mark.parametrize("T", [1, 6])
def test_cached_greedy_generate_equals_recomputation(rt, T):
    """transformers' generate(): the prompt prefilled by the tiled scan into the DynamicLayers, then one
    position at a time (RTLayer.decode over the cached persistent pairs)."""
    model, cfg, _, hf = rt
    ids, n = prompt(T=T, seed=10 + T), 10
    cached = hf_greedy(hf, ids, n, use_cache=True)
    expected = recompute_greedy(model, ids, n, cfg.vocab_size)
    assert type(cached.past_key_values).__name__ == "RGPTCache"
    assert cached.past_key_values.get_seq_length() == T + n - 1  # the last token is sampled, never fed
    assert torch.equal(cached.sequences, expected)
    assert torch.equal(cached.sequences, generate(model, ids, n, strategy="full"))  # the native static cache
    assert all(len(set(row.tolist())) >= 4 for row in expected[:, T:]), expected[:, T:]  # not a repeated token
    # the cache's logits in fp64 against the whole-sequence forward: the prompt, then one token per
    # forward, then a chunk of 3 at once (decoded position by position); measured <= 3.0e-14 on logits ~9
    # (2026-12-03; fp32: 8.7e-6, the decode step's sums in another order than the tiled scan's)
    hf64, model64 = copy.deepcopy(hf).double(), copy.deepcopy(model).double()
    cache = hf64.make_cache()
    with torch.no_grad():
        steps = [hf64(expected[:, :T], past_key_values=cache).logits]
        steps += [hf64(expected[:, i:i + 1], past_key_values=cache).logits for i in range(T, T + n - 4)]
        steps += [hf64(expected[:, T + n - 4:T + n - 1], past_key_values=cache).logits]
        whole = model64(expected[:, :-1]).logits[..., :cfg.vocab_size]
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-12, rtol=0)


def test_beam_search_batch_selection_and_crop(rt):
    model, cfg, _, hf = rt
    ids = prompt(T=6)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8, do_sample=False,
              pad_token_id=0, num_beams=3)
    with torch.no_grad():
        assert torch.equal(hf.generate(ids, use_cache=True, **kw), hf.generate(ids, use_cache=False, **kw))
    # directly, in fp64: a cache of rows (a, b, c) reordered to (c, a, a) continues as one filled with those
    # rows; selecting row 1 as row 1 alone; crop(-2) (both transformers' spelling of "drop 2") as the
    # sequence without its last 2 tokens (position t's pair depends on positions <= t only)
    hf64, model64 = copy.deepcopy(hf).double(), copy.deepcopy(model).double()
    rows, step = prompt(B=3, T=6, seed=5), prompt(B=3, T=2, seed=6)
    order = torch.tensor([2, 0, 0])

    def native(tokens):
        return model64(tokens).logits[:, -step.shape[1]:, :cfg.vocab_size]

    with torch.no_grad():
        reordered, selected, cropped = hf64.make_cache(), hf64.make_cache(), hf64.make_cache()
        for cache in (reordered, selected, cropped):
            hf64(rows, past_key_values=cache)
        reordered.reorder_cache(order)
        selected.batch_select_indices(torch.tensor([1]))
        hf64(step, past_key_values=cropped)
        cropped.crop(-2)
        assert cropped.get_seq_length() == 6
        got = [hf64(step, past_key_values=reordered).logits, hf64(step[1:2], past_key_values=selected).logits,
               hf64(step.flip(0), past_key_values=cropped).logits]
        expected = [native(torch.cat([rows[order], step], 1)), native(torch.cat([rows[1:2], step[1:2]], 1)),
                    native(torch.cat([rows, step.flip(0)], 1))]
        unordered = native(torch.cat([rows, step], 1))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=0)
    assert (got[0] - unordered).abs().max() > 1  # the reorder matters here


def test_what_the_export_refuses(rt, tmp_path):
    model, cfg, out, hf = rt
    ids = prompt()
    with pytest.raises(ValueError, match=r"r_eval=2: this model \(family 'rt'\) has no recurrence depth"):
        load(out, r_eval=2)
    with pytest.raises(ValueError, match=r"kv_strategy='average': this model's cache offers full only"):
        load(out, kv_strategy="average")
    with pytest.raises(ValueError, match=r"num_steps=1: this model \(family 'rt'\) has no recurrence depth"):
        hf(ids, num_steps=1)
    padded = torch.ones_like(ids)
    padded[0, :2] = 0
    with pytest.raises(ValueError, match="RT does not support padded batches"):
        hf(ids, attention_mask=padded)
    # a hand-edited config.json the native RTConfig would refuse (RGPTConfig carries the fields unchecked)
    edited = tmp_path / f"rt_{'tied' if cfg.tie_embeddings else 'untied'}_edited"
    shutil.copytree(out, edited)
    fields = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**fields, "prefill": "fast"}))
    with pytest.raises(ValueError, match=r"model.prefill='fast' is not one of tiled, naive"):
        load(edited)
