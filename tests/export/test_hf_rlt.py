"""The Recurrent Looped Transformer's Hugging Face export (issue 25: "native and HF export (the
trainer's own module shipped) and cached generation"; acceptance "export + reload + generate"):
rgpt_dist.export.hf_looped_writer writes RLT as it writes the looped families, shipping
rgpt_dist/models/rlt/model.py and cache.py verbatim but for their imports. Against the native model
(tiny rlt1-debug, rlt2-debug (B = 2), rlt2-debug at B = 4 and rlt0-debug, fp32, moved off the init):
logits and loss, cached greedy generate() (prompts ending mid-chunk and at a chunk's end) against a
recompute loop written here and the native cached generate, beam search (the cache reorders the
decoder's carried rings and state), and what the export refuses (a depth, padded batches, dropping
or re-batching cached tokens). And the tokenizer an export of an algorithmic task's run ships
(rgpt_dist.export.tokenizer_files.write_task_tokenizer) against each task's own examples."""
import ast
import copy
import importlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rgpt_dist.algorithmic import TASKS
from rgpt_dist.eval.harness import HarnessError, hf_model_args
from rgpt_dist.export.hf_looped_writer import write_hf_looped
from rgpt_dist.export.remote_code import RemoteCodeRefused, trust_remote_code
from rgpt_dist.export.tokenizer_files import write_task_tokenizer
from rgpt_dist.models.generate import generate
from rgpt_dist.models.spec import spec_for
from rgpt_dist.registry import build_model
from tests.helpers.hf import greedy as hf_greedy, load_remote as load

SPEC = spec_for("rlt")
SMALL = dict(vocab_size=300, pad_vocab_multiple=128, block_size=64)
MODELS = {"rlt1": ("rlt1-debug", {}), "rlt2": ("rlt2-debug", {}), "rlt2-b4": ("rlt2-debug", {"feedback_interval": 4}),
          "rlt0": ("rlt0-debug", {})}
# the looped families' step (0.1) leaves RLT's greedy stream repeating a token or two; 0.3 as the contract test
PERTURB = 0.3


@pytest.fixture(scope="module", params=list(MODELS))
def rlt(request, hf_env, tmp_path_factory):
    """(native model, its config, the export directory, the export loaded), one per model."""
    flavour, extra = MODELS[request.param]
    cfg = SPEC.config(**{**SPEC.flavours[flavour], **SMALL, **extra})
    model = build_model(cfg, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * PERTURB)
    # transformers keys remote-code modules by the directory's name: one name per model
    out = write_hf_looped(model.state_dict(), cfg, tmp_path_factory.mktemp("hf") / f"{request.param}_export")
    return model.eval(), cfg, out, load(out)


def prompt(B=2, T=7, seed=3):
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def recompute_greedy(model, ids, n, vocab):
    """Greedy decoding by the whole-sequence forward on every prefix: (tokens (B, T + n), the logits
    of each new token (B, n, vocab))."""
    logits = []
    with torch.no_grad():
        for _ in range(n):
            last = model(ids).logits[:, -1, :vocab]                    # (B, V)
            logits.append(last)
            ids = torch.cat([ids, last.argmax(-1, keepdim=True)], 1)
    return ids, torch.stack(logits, 1)


def _code_lines(source: str) -> list[str]:
    """The source without its import statements (what must be the same in the export)."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            lines[node.lineno - 1:node.end_lineno] = [None] * (node.end_lineno - node.lineno + 1)
    return [line for line in lines if line is not None]


def test_the_export_ships_rlts_own_modules_and_a_depthless_config(rlt):
    model, cfg, out, hf = rlt
    assert {p.name for p in out.glob("*.py")} == {"configuration_rgpt.py", "cache_rgpt.py", "modeling_rgpt.py",
                                                 "rlt_model.py", "rlt_cache.py", "kv_cache.py", "layers.py",
                                                 "block_options.py"}
    for module, file in (("rgpt_dist.models.rlt.model", "rlt_model.py"), ("rgpt_dist.models.rlt.cache", "rlt_cache.py"),
                         ("rgpt_dist.models.kv_cache", "kv_cache.py"), ("rgpt_dist.models.layers", "layers.py")):
        source = Path(importlib.import_module(module).__file__).read_text()
        assert _code_lines((out / file).read_text()) == _code_lines(source), file
    for path in out.glob("*.py"):  # nothing of the package is imported
        assert "rgpt_dist" not in "".join(line for line in path.read_text().splitlines()
                                          if line.lstrip().startswith(("import ", "from "))), path.name
    assert "from .rlt_model import RLT as NativeModel" in (out / "modeling_rgpt.py").read_text()
    assert set(load_file(out / "model.safetensors")) == {f"model.{k}" for k in model.state_dict()}
    config = json.loads((out / "config.json").read_text())
    assert config["family"] == "rlt" and set(config["native_fields"]) == set(cfg.to_dict())
    assert not {"n_pre", "n_rec", "n_coda", "n_loops"} & set(config) and config["r_eval"] is None
    c = hf.config
    assert (c.has_depth, c.r_eval, c.num_hidden_layers, c.feedback_interval) == (False, None, 4, cfg.feedback_interval)
    assert (c.hidden_size, c.num_attention_heads, c.max_position_embeddings, c.kv_strategies) == (32, 4, 64, ["full"])
    assert type(hf.model).__name__ == "RLT" and hf.model.head.wte[0] is hf.get_input_embeddings()
    # rgpt-eval's default remote-code policy runs it (the code is this checkout's), and refuses a changed file
    assert trust_remote_code(out) is True
    changed = out.parent / f"{out.name}_changed"
    shutil.copytree(out, changed)
    (changed / "rlt_cache.py").write_text((changed / "rlt_cache.py").read_text() + "\n# edited\n")
    with pytest.raises(RemoteCodeRefused, match=r"ships model code that is not this checkout's \(rlt_cache.py\)"):
        trust_remote_code(changed)


def test_logits_and_loss_equal_the_native_model(rlt):
    model, cfg, _, hf = rlt
    ids = prompt(T=13)
    labels = ids.clone()
    labels[0, 4:7] = -100
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)  # native: unshifted,
    targets[targets == -100] = -1                                                     # -1 ignored
    with torch.no_grad():
        expected = model(ids, targets)
        out, uncached = hf(ids, labels=labels), hf(ids, use_cache=False)
    assert out.logits.shape == (2, 13, 300) and out.logits.abs().max() > 0.1
    # the same modules on the same inputs: logits measured bitwise equal (2026-12-03); the loss is
    # summed over the real vocabulary here, the padded one natively: 8.1e-8 relative measured
    torch.testing.assert_close(out.logits, expected.logits[..., :300], atol=0, rtol=0)
    torch.testing.assert_close(out.loss, expected.loss, atol=0, rtol=1e-6)
    torch.testing.assert_close(uncached.logits, out.logits, atol=0, rtol=0)
    assert type(out.past_key_values).__name__ == "RGPTCache" and uncached.past_key_values is None


@pytest.mark.parametrize("T", [5, 6, 8])
def test_cached_greedy_generate_equals_recomputation(rlt, T):
    """Prompts of 5 and 6 tokens end inside a chunk of B = 4 (5 inside one of B = 2), 8 at a chunk's
    end: the cache's prefill leaves the register at the last complete chunk and the decode steps
    complete the partial one (paper I.3)."""
    model, cfg, _, hf = rlt
    ids, n = prompt(T=T, seed=T), 12
    cached = hf_greedy(hf, ids, n, use_cache=True)
    expected, _ = recompute_greedy(model, ids, n, cfg.vocab_size)
    assert type(cached.past_key_values).__name__ == "RGPTCache"
    assert cached.past_key_values.get_seq_length() == T + n - 1  # the last token is sampled, never fed
    assert torch.equal(cached.sequences, expected)
    assert torch.equal(cached.sequences, generate(model, ids, n, strategy="full"))  # the native cache
    assert all(len(set(row.tolist())) >= 5 for row in expected[:, T:]), expected[:, T:]  # not a repeated token
    # the logits of that cached decoding, one token per forward, in fp64 against the whole-sequence
    # forward: measured <= 2.1e-12 (logits ~100; in fp32 up to 6.2e-4, 40 ulp: these perturbed weights
    # amplify rounding, so fp64 tells rounding from a state or ring read at the wrong position)
    hf64, model64 = copy.deepcopy(hf).double(), copy.deepcopy(model).double()
    cache = hf64.make_cache()
    with torch.no_grad():
        steps = [hf64(expected[:, :T], past_key_values=cache).logits]
        steps += [hf64(expected[:, i:i + 1], past_key_values=cache).logits for i in range(T, T + n - 1)]
        whole = model64(expected[:, :-1]).logits[..., :cfg.vocab_size]
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-9, rtol=0)


def test_beam_search_reorders_the_carried_state(rlt):
    model, cfg, _, hf = rlt
    ids = prompt(T=6)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8, do_sample=False,
              pad_token_id=0, num_beams=3)
    with torch.no_grad():
        assert torch.equal(hf.generate(ids, use_cache=True, **kw), hf.generate(ids, use_cache=False, **kw))
    # directly: a cache of rows (a, b, c) reordered to (c, a, a) continues as one filled with those rows
    # directly, in fp64 (rounding apart: see above): a cache of rows (a, b, c) reordered to (c, a, a)
    # continues as one filled with those rows
    hf64, model64 = copy.deepcopy(hf).double(), copy.deepcopy(model).double()
    rows, step = prompt(B=3, T=6, seed=5), prompt(B=3, T=1, seed=6)
    order = torch.tensor([2, 0, 0])
    cache = hf64.make_cache()
    with torch.no_grad():
        hf64(rows, past_key_values=cache)
        cache.reorder_cache(order)
        got = hf64(step, past_key_values=cache).logits
        expected = model64(torch.cat([rows[order], step], 1)).logits[:, -1:, :cfg.vocab_size]
        unordered = model64(torch.cat([rows, step], 1)).logits[:, -1:, :cfg.vocab_size]
    torch.testing.assert_close(got, expected, atol=1e-9, rtol=0)
    assert (got - unordered).abs().max() > 1  # the reorder matters here


def test_what_the_export_refuses(rlt, tmp_path):
    model, cfg, out, hf = rlt
    ids = prompt()
    with pytest.raises(ValueError, match=r"r_eval=2: this model \(family 'rlt'\) has no recurrence depth"):
        load(out, r_eval=2)
    with pytest.raises(ValueError, match=r"r_eval=2: this model \(family 'rlt'\) has no recurrence depth"):
        write_hf_looped(model.state_dict(), cfg, tmp_path / "deep", r_eval=2)
    assert not (tmp_path / "deep").exists()  # refused before anything is written
    with pytest.raises(ValueError, match=r"num_steps=1: this model \(family 'rlt'\) has no recurrence depth"):
        hf(ids, num_steps=1)
    # a config.json claiming one looped field needs them all (a depth is bounded only through them), and
    # one without a depth needs num_hidden_layers
    fields = json.loads((out / "config.json").read_text())
    with pytest.raises(ValueError, match=r"the native model fields \['n_rec', 'n_pre', 'n_coda'\] are missing"):
        type(hf.config)(**{**fields, "native_fields": fields["native_fields"] + ["n_loops"], "n_loops": 3})
    with pytest.raises(ValueError, match="num_hidden_layers=None must be an integer >= 1"):
        type(hf.config)(**{k: v for k, v in fields.items() if k != "num_hidden_layers"})
    for token in (300, -1):  # outside the vocabulary (a GPT-2 tokenizer's ids on a task model)
        with pytest.raises(ValueError, match=f"input_ids hold token {token}, outside this model's vocabulary of 300"):
            hf(torch.cat([ids, torch.tensor([[token], [0]])], 1))
    padded = torch.ones_like(ids)
    padded[0, :2] = 0
    with pytest.raises(ValueError, match="RLT does not support padded batches"):
        hf(ids, attention_mask=padded)
    cache = hf.make_cache()
    with torch.no_grad():
        hf(ids, past_key_values=cache)
    cache.crop(ids.shape[1])  # keeping every token (4.57's crop(n) keeps n) changes nothing
    for refused in (lambda: cache.crop(3), lambda: cache.crop(-1),
                    lambda: cache.batch_select_indices(torch.tensor([0])), lambda: cache.batch_repeat_interleave(2)):
        with pytest.raises(ValueError, match="carries a recurrent state .* cannot be rolled back or re-batched"):
            refused()
    assert cache.get_seq_length() == ids.shape[1]


def test_write_hf_looped_refuses_a_family_with_another_writer(tmp_path):
    cfg = spec_for("gpt2").config(vocab_size=300, block_size=64, d_model=32, n_head=4, n_layer=1)
    with pytest.raises(ValueError, match="not 'gpt2' \\(its hf_writer: 'rgpt_dist.export.hf_dense:write_hf_gpt2'\\)"):
        write_hf_looped(build_model(cfg, seed=0).state_dict(), cfg, tmp_path / "gpt2")
    assert not (tmp_path / "gpt2").exists()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_task_tokenizer_maps_the_tasks_text_to_its_ids(name, tmp_path):
    """A sequence's text is its symbols concatenated (docs/algorithmic.md); the tokenizer gives back
    the task's ids, decodes them to the text, and carries the task's special ids into config.json."""
    from transformers import AutoTokenizer

    task = TASKS[name]
    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 50256, "eos_token_id": 50256}))
    write_task_tokenizer(tmp_path, task.vocab, model_max_length=64, task=name)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    # training draws (a held-out set is built whole on first use: seconds at the test lengths)
    for ids in [task.example("train", i).tokens.tolist() for i in range(8)]:
        text = "".join(task.vocab[i] for i in ids)
        assert tok(text).input_ids == ids, text
        assert tok.decode(ids) == text
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2) == (
        task.vocab.index("<pad>"), task.vocab.index("<bos>"), task.vocab.index("<eos>"))
    config = json.loads((tmp_path / "config.json").read_text())
    assert [config[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id", "rgpt_task")] == [0, 1, 2, name]
    with pytest.raises(HarnessError, match=f"is a model of the algorithmic task '{name}'.*rgpt-algo eval RUN"):
        hf_model_args(tmp_path)  # rgpt-eval lm-eval: text tasks do not apply
    with pytest.raises(Exception, match=r"Missing \[UNK\] token"):  # text outside the task: refused
        tok("hello")
