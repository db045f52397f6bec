"""model.pos_encoding (rgpt_dist.models.layers, docs/models.md): RoPE and ALiBi equal fp64 references
written here from their definitions; cached decoding (eager, and the fixed-shape step the compiled
decode runs) equals recomputation with every encoding; rope / alibi / none run past block_size while
learned refuses; `learned` is what it was (weights bitwise, logits to fp32 rounding: a fixture saved
from the code before the field, tests/models/data/gen_learned_head.py); tensor parallelism and the
Hugging Face exports."""
import copy
import json
import math
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rgpt_dist.config import GPT2Config, RecurrentGPTConfig
from rgpt_dist.models.generate import _fixed_shape_step
from rgpt_dist.models.layers import CausalSelfAttention, LayerFactory
from rgpt_dist.models.spec import families
from tests.helpers.dist import torchrun
from tests.helpers.tolerance import fp32_bound, max_abs, tp_matches

DATA = Path(__file__).parent / "data"
ENCODINGS = ("learned", "rope", "alibi", "none")
SMALL = dict(vocab_size=64, block_size=40, d_model=16, n_head=2)


def attention(pos_encoding, n_head, d_model, seed=0):
    cfg = types.SimpleNamespace(d_model=d_model, n_head=n_head, head_dim=d_model // n_head, bias=True,
                                init_std=0.3, pos_encoding=pos_encoding, rope_base=100.0)
    torch.manual_seed(seed)
    attn = CausalSelfAttention(cfg, LayerFactory(), 0.3).double()
    with torch.no_grad():
        attn.qkv.bias.normal_(0, 0.3)
    return attn, cfg


def reference(attn, cfg, x, transform_qk=None, bias=None):
    """Plain per-head causal attention in fp64 with loops over heads; transform_qk(q, k) -> (q, k) on
    one head's (T, hd); bias(h) -> (T, T) added to that head's logits."""
    T, H, hd = x.shape[1], cfg.n_head, cfg.head_dim
    qkv = (x[0] @ attn.qkv.weight.T + attn.qkv.bias).view(T, H, 3, hd)   # per-head [q|k|v] layout
    heads = []
    for h in range(H):
        q, k, v = qkv[:, h, 0], qkv[:, h, 1], qkv[:, h, 2]
        if transform_qk is not None:
            q, k = transform_qk(q, k)
        logits = q @ k.T / math.sqrt(hd) + (0 if bias is None else bias(h))
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        heads.append(torch.softmax(logits.masked_fill(~causal, float("-inf")), -1) @ v)
    return (torch.cat(heads, -1) @ attn.proj.weight.T + attn.proj.bias)[None]


def test_rope_equals_rotation_matrices_fp64():
    attn, cfg = attention("rope", n_head=2, d_model=12)
    x = torch.randn(1, 9, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    hd, base = cfg.head_dim, cfg.rope_base

    def rotation(t):  # block rotation of feature pairs (j, j + hd/2) by angle t * base^(-2j/hd)
        m = torch.zeros(hd, hd, dtype=torch.float64)
        for j in range(hd // 2):
            a = t * base ** (-2 * j / hd)
            c, s = math.cos(a), math.sin(a)
            m[j, j], m[j, j + hd // 2], m[j + hd // 2, j], m[j + hd // 2, j + hd // 2] = c, -s, s, c
        return m

    def rotate(q, k):
        R = torch.stack([rotation(t) for t in range(q.shape[0])])          # (T, hd, hd)
        return (R @ q[..., None])[..., 0], (R @ k[..., None])[..., 0]

    with torch.no_grad():
        got = attn(x)
        torch.testing.assert_close(got, reference(attn, cfg, x, transform_qk=rotate), rtol=1e-12, atol=1e-12)
        assert (got - reference(attn, cfg, x)).abs().max() > 1e-3  # the rotation matters


@pytest.mark.parametrize("n_head,slopes", [
    (4, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]),        # 2^(-8/4) geometric
    (3, [2 ** -4, 2 ** -8, 2 ** -2]),                 # 2 heads' slopes, then every other of 4's
    (6, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]),
])
def test_alibi_equals_explicit_slopes_and_bias_fp64(n_head, slopes):
    attn, cfg = attention("alibi", n_head=n_head, d_model=2 * n_head)
    x = torch.randn(1, 7, 2 * n_head, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    T = x.shape[1]
    dist = torch.tensor([[j - i for j in range(T)] for i in range(T)], dtype=torch.float64)  # key - query
    with torch.no_grad():
        torch.testing.assert_close(attn(x), reference(attn, cfg, x, bias=lambda h: slopes[h] * dist),
                                   rtol=1e-12, atol=1e-12)


def build(family, pos_encoding, seed=0, **kw):
    spec = families()[family]
    extra = {"gpt2": dict(n_layer=2), "rt": dict(n_layer=2), "rlt": dict(n_enc=1, n_dec=1)}.get(family, dict(n_pre=1, n_rec=1, n_coda=1,
                                                                                   n_loops=2))
    cfg = spec.config(family=family, pos_encoding=pos_encoding, **{**SMALL, **extra, **kw})
    torch.manual_seed(seed)
    model = spec.build(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.double().eval(), cfg


@pytest.mark.parametrize("family", ["gpt2", "recurrent_gpt"])
@pytest.mark.parametrize("pos_encoding", ENCODINGS)
def test_cached_decoding_equals_recomputation(family, pos_encoding):
    """Chunks through a static cache, and single tokens through the fixed-shape step (what
    generate(compile_backend=...) compiles, run eagerly here), equal the whole sequence at once."""
    model, cfg = build(family, pos_encoding)
    idx = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(idx).logits
        cache = model.make_cache("full")
        got = torch.cat([model(c, cache=cache).logits for c in torch.split(idx, [5, 1, 3, 3], dim=1)], 1)
        torch.testing.assert_close(got, full, rtol=1e-10, atol=1e-10)
        fixed = model.make_cache("full", max_len=12, fixed=True)
        steps = [model(idx[:, :5], cache=fixed).logits[:, -1]]
        fixed.slots.index = torch.empty(1, dtype=torch.long)
        for t in range(5, 12):
            fixed.slots.index.fill_(t)
            steps.append(_fixed_shape_step(model, idx[:, t:t + 1], fixed, {}))
        torch.testing.assert_close(torch.stack(steps, 1), full[:, 4:], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("family", ["gpt2", "recurrent_gpt"])
def test_left_padding_changes_nothing_with_rope_and_alibi(family):
    """A left-padded row (layers.padding_mask) gives its unpadded logits: relative encodings see
    the same distances however many pads precede (positions feed the learned embedding only)."""
    from rgpt_dist.models.layers import padding_mask

    for pos_encoding in ("rope", "alibi"):
        model, cfg = build(family, pos_encoding)
        idx = torch.randint(1, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(8))
        attention = torch.ones(2, 8, dtype=torch.long)
        attention[0, :3] = 0                                   # row 0: 3 pads, then 5 real tokens
        mask, positions = padding_mask(attention, 8)
        with torch.no_grad():
            padded = model(idx, mask=mask, positions=positions).logits
            alone = model(idx[:1, 3:]).logits
        torch.testing.assert_close(padded[:1, 3:], alone, rtol=1e-10, atol=1e-10)


def test_compiled_decode_equals_uncached_rope_and_alibi():
    """generate(compile_backend='aot_eager'): the compiled fixed-shape decode step with rope and alibi
    gives the tokens of uncached greedy decoding."""
    from rgpt_dist.models.generate import generate

    for pos_encoding in ("rope", "alibi"):
        model, cfg = build("recurrent_gpt", pos_encoding)
        model = model.float()
        idx = torch.randint(0, cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(9))
        want = generate(model, idx, 6, strategy=None)
        assert torch.equal(generate(model, idx, 6, strategy="full", compile_backend="aot_eager"), want)


@pytest.mark.parametrize("strategy", ["first", "average"])
def test_compressed_cache_fixed_shape_equals_eager_rope_alibi(strategy):
    """The compressed strategies (not equal to recomputation by design): the fixed-shape step equals
    the eager cached decoding with rotated keys and with the ALiBi bias."""
    for pos_encoding in ("rope", "alibi"):
        model, cfg = build("recurrent_gpt", pos_encoding)
        idx = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            eager = model.make_cache(strategy, max_len=9)
            want = [model(idx[:, :4], cache=eager).logits[:, -1]]
            want += [model(idx[:, t:t + 1], cache=eager).logits[:, -1] for t in range(4, 9)]
            fixed = model.make_cache(strategy, max_len=9, fixed=True)
            got = [model(idx[:, :4], cache=fixed).logits[:, -1]]
            fixed.slots.index = torch.empty(1, dtype=torch.long)
            for t in range(4, 9):
                fixed.slots.index.fill_(t)
                got.append(_fixed_shape_step(model, idx[:, t:t + 1], fixed, {}))
        torch.testing.assert_close(torch.stack(got), torch.stack(want), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("family", sorted(families()))
def test_runs_past_block_size_except_learned(family):
    """block_size 40; a forward of 256 tokens: rope, alibi, none run (finite logits, no wpe, the first
    40 as a forward of those alone); learned refuses naming the length and block_size."""
    kw = dict(lora_rank=2) if family == "relaxed" else {}
    idx = torch.randint(0, SMALL["vocab_size"], (1, 256), generator=torch.Generator().manual_seed(5))
    for pos_encoding in ("rope", "alibi", "none"):
        if family == "rlt" and pos_encoding == "alibi":  # its window and memory attention have no bias
            with pytest.raises(ValueError, match="pos_encoding='alibi' is not supported by RLT"):
                build(family, pos_encoding)
            continue
        model, _ = build(family, pos_encoding, **kw)
        assert not any("wpe" in k for k in model.state_dict()), (family, pos_encoding)
        with torch.no_grad():
            logits = model(idx).logits
            assert torch.isfinite(logits).all(), (family, pos_encoding)
            # causal: the first block_size tokens as if alone (Poisson's evaluation state keeps its rows)
            torch.testing.assert_close(logits[:, :40], model(idx[:, :40]).logits, rtol=1e-10, atol=1e-10)
    model, _ = build(family, "learned", **kw)
    with pytest.raises(ValueError, match=r"sequence length 256 exceeds block_size=40: pos_encoding='learned'"):
        model(idx)


def test_learned_unchanged():
    """Every family at a seed: state-dict names, order and values bitwise those the code had before
    pos_encoding existed (tests/models/data/learned_head.safetensors; torch's CPU generator is the same
    on every host), and the logits those weights gave then, to fp32 rounding: the fixture was computed
    on one CPU, and another CPU's kernels round differently (1.9e-8 to 3.0e-8 on a Xeon with AMX), so
    the bound is tests/helpers/tolerance.py's, from a float64 forward of the same weights."""
    ref = load_file(DATA / "learned_head.safetensors")
    fams = {"gpt2": dict(n_layer=2), "relaxed": dict(lora_rank=2),
            "recurrent_gpt": dict(n_pre=1, n_rec=1, n_coda=1, n_loops=2)}
    saved = sorted({k.split("/")[0] for k in ref})
    assert saved == sorted(set(families()) - {"rlt", "rt"})  # RLT, RT came after pos_encoding: nothing to keep
    for fam in saved:
        spec = families()[fam]
        cfg = spec.config(family=fam, vocab_size=32, block_size=16, d_model=8, n_head=2, **fams.get(fam, {}))
        assert cfg.pos_encoding == "learned"
        torch.manual_seed(1234)
        model = spec.build(cfg).eval()
        sd = model.state_dict()
        keys = sorted(k for k in ref if k.startswith(fam + "/sd/"))
        assert [k.split("/", 3)[3] for k in keys] == list(sd), fam
        for k in keys:
            assert torch.equal(ref[k], sd[k.split("/", 3)[3]]), (fam, k)
        idx = torch.arange(24).view(2, 12) % 32
        with torch.no_grad():
            got, exact = model(idx).logits, copy.deepcopy(model).double()(idx).logits
        want = ref[fam + "/logits"]
        assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape, fam
        bound = fp32_bound(max_abs(got, exact), scale=exact.abs().max().item())
        assert max_abs(got, want) <= bound, (fam, max_abs(got, want), bound)


@pytest.mark.parametrize("overrides,message", [
    (dict(pos_encoding="rotary"), "model.pos_encoding='rotary' is not one of learned, rope, alibi, none"),
    (dict(pos_encoding="rope", rope_base=float("nan")), "model.rope_base=nan must be finite"),
    (dict(pos_encoding="rope", rope_base=1.0), "model.rope_base=1.0 must be > 1"),
    (dict(pos_encoding="rope", d_model=12, n_head=4), "head_dim = d_model / n_head = 3 must be even"),
])
def test_config_refuses_bad_pos_encoding(overrides, message):
    problems = GPT2Config(**{**dict(n_layer=1, d_model=16, n_head=2), **overrides}).problems("model")
    assert any(message in p for p in problems), problems
    assert not GPT2Config(n_layer=1, d_model=12, n_head=4, pos_encoding="alibi").problems("model")


@pytest.mark.slow
def test_tp2_equals_tp1_with_rope_and_alibi(tmp_path):
    """tp = 2 (heads split; ALiBi's slopes follow each rank's heads) against tp = 1, as
    tests/parallel/test_tensor_parallel.py's bounds."""
    torchrun("tests.models.tp_pos_encoding", 2, str(tmp_path / "out"))
    for rank in (0, 1):
        results = json.loads((tmp_path / f"out.{rank}.json").read_text())
        assert sorted(results) == ["gpt2/alibi", "gpt2/rope", "recurrent_gpt/alibi"]
        for name, got in results.items():
            assert tp_matches(got), (name, rank, got)


LOOPED_EXTRA = {"relaxed": dict(lora_rank=2), "poisson": dict(k_max=2)}


@pytest.mark.parametrize("family", sorted(n for n, s in families().items() if s.recurrent))
def test_hf_looped_export_round_trip(family, tmp_path):
    """The trust_remote_code export of every looped family with rope, alibi and none: the config
    carries the encoding, logits equal the native model's, and cached generation (the export's
    RGPTCache, `full`) equals the native uncached greedy decoding."""
    from transformers import AutoModelForCausalLM

    from rgpt_dist.export.hf_looped_writer import write_hf_looped
    from rgpt_dist.models.generate import generate
    from tests.helpers.hf import isolated_hf

    idx = torch.randint(0, SMALL["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(6))
    with isolated_hf(tmp_path / "home"):
        for pos_encoding in ("rope", "alibi", "none"):
            model, cfg = build(family, pos_encoding, **LOOPED_EXTRA.get(family, {}))
            model = model.float()
            out = write_hf_looped(model.state_dict(), cfg, tmp_path / f"{family}_{pos_encoding}_export")
            assert json.loads((out / "config.json").read_text())["pos_encoding"] == pos_encoding
            hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
            with torch.no_grad():
                torch.testing.assert_close(hf(idx).logits, model(idx).logits[..., :cfg.vocab_size])
                got = hf.generate(idx, max_new_tokens=8, do_sample=False, pad_token_id=0)
            assert torch.equal(got, generate(model, idx, 8, strategy=None)), (family, pos_encoding)


def test_hf_dense_export_refuses_other_encodings(tmp_path):
    """A stock GPT2LMHeadModel has learned positions only: a dense rope model is refused by name."""
    from rgpt_dist.checkpoints.consolidate import ExportError
    from rgpt_dist.export.hf_dense import write_hf_gpt2

    model, cfg = build("gpt2", "rope")
    with pytest.raises(ExportError, match=r"model.pos_encoding='rope'.*GPT2LMHeadModel"):
        write_hf_gpt2(model.state_dict(), cfg, tmp_path / "hf", dtype=torch.float32)
    assert not (tmp_path / "hf").exists()


V5_SCRIPT = """
import json, sys, torch, transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
job = json.loads(sys.argv[1])
ids = torch.tensor(job["ids"])
out = {}
for name, path in job["paths"].items():
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    with torch.no_grad():
        out[name + ".logits"] = model(ids).logits.contiguous()
        out[name + ".generated"] = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
save_file(out, "out.safetensors", metadata={"version": transformers.__version__})
"""


@pytest.mark.slow
def test_hf_looped_export_under_transformers5(tmp_path):
    """The rope and alibi exports (written under the pinned 4.57) load under transformers 5: logits
    equal the native model's, cached greedy generation equals the native uncached decoding."""
    import os
    import subprocess
    import sys

    from safetensors import safe_open

    from rgpt_dist.export.hf_looped_writer import write_hf_looped
    from rgpt_dist.models.generate import generate
    from tests.export.test_transformers5 import TARGET, transformers5

    transformers5()
    idx = torch.randint(0, SMALL["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(7))
    natives, paths = {}, {}
    for pos_encoding in ("rope", "alibi"):
        model, cfg = build("recurrent_gpt", pos_encoding)
        natives[pos_encoding] = model = model.float()
        paths[pos_encoding] = str(write_hf_looped(model.state_dict(), cfg, tmp_path / f"v5_{pos_encoding}_export"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(TARGET), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp_path / "home"),
               HF_MODULES_CACHE=str(tmp_path / "modules"), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", V5_SCRIPT, json.dumps({"ids": idx.tolist(), "paths": paths})],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    with safe_open(tmp_path / "out.safetensors", "pt") as f:
        assert int(f.metadata()["version"].split(".")[0]) >= 5
    got = load_file(tmp_path / "out.safetensors")
    for pos_encoding, model in natives.items():
        with torch.no_grad():
            torch.testing.assert_close(got[pos_encoding + ".logits"], model(idx).logits[..., :model.cfg.vocab_size])
        assert torch.equal(got[pos_encoding + ".generated"], generate(model, idx, 6, strategy=None))


@pytest.mark.parametrize("fields,message", [
    (dict(pos_encoding="bogus"), "pos_encoding='bogus' is not one of learned, rope, alibi, none"),
    (dict(pos_encoding="rope", rope_base=float("nan")), "rope_base=nan must be a finite number > 1"),
    (dict(pos_encoding="rope", rope_base="10000"), "rope_base='10000' must be a finite number > 1"),
    (dict(pos_encoding="rope", d_model=12, n_head=4), "head_dim=3 must be even"),
])
def test_layers_refuse_a_bad_config_json(fields, message):
    """An export's config.json reaches the layers without ModelConfig.problems (the remote code
    reads it as attributes): the layers refuse a bad value by name rather than compute NaN."""
    cfg = types.SimpleNamespace(**{**dict(d_model=16, n_head=2, bias=True, init_std=0.02), **fields})
    cfg.head_dim = cfg.d_model // cfg.n_head
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CausalSelfAttention(cfg, LayerFactory(), 0.02)


@pytest.mark.parametrize("family", sorted(families()))
def test_param_count_drops_wpe_without_learned(family):
    """rgpt_dist.flops.param_count (rgpt-flops) counts wpe only with learned, as the model holds it."""
    from rgpt_dist.flops import param_count

    kw = dict(lora_rank=2) if family == "relaxed" else {}
    for pos_encoding in ENCODINGS:
        if family == "rlt" and pos_encoding == "alibi":  # refused (test_runs_past_block_size_except_learned)
            continue
        model, cfg = build(family, pos_encoding, **kw)
        assert param_count(cfg) == sum(p.numel() for p in model.parameters()), (family, pos_encoding)
