"""The RLT paper's decoder-only Transformer baseline (model.norm / mlp / d_ff / qk_norm / mup_base_width,
flavours rlt-transformer-8/16/debug): parameter counts against the paper's, logits against an fp64
reference written here from the definitions, muP's init and per-group learning rates, cached
decoding, the configuration's errors and the dense HF export's refusal."""
import math
import re
import types

import pytest
import torch

from rgpt_dist.config import GPT2Config, TrainConfig, load_config
from rgpt_dist.flops import block_flops, param_count
from rgpt_dist.registry import build_model
from rgpt_dist.train.optim import lr_at, make_optimizer, make_scheduler

F64 = torch.float64
TINY = dict(vocab_size=11, pad_vocab_multiple=8, block_size=16, d_model=16, n_head=2, n_layer=2)
RLT = dict(norm="rmsnorm", mlp="swiglu", d_ff=24, qk_norm=True, pos_encoding="rope", bias=False)


@pytest.mark.parametrize("name, expected", [("rlt-transformer-8", 25_314_304), ("rlt-transformer-16", 50_486_272)])
def test_parameter_count_is_the_papers(name, expected):
    """Paper Table 4: Transformer 8 has 25.31M unique parameters. Per layer 4 d^2 (attention) +
    3 d 1365 (SwiGLU) + 2 d (RMSNorm gains) + 2 x 128 (QK-norm gains), + 277 d tied embedding + d."""
    d, f, hd = 512, 1365, 128
    n_layer = int(name.rsplit("-", 1)[1])
    assert expected == n_layer * (4 * d * d + 3 * d * f + 2 * d + 2 * hd) + 277 * d + d
    cfg = load_config(name).model
    with torch.device("meta"):
        model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == expected == param_count(cfg)
    assert round(param_count(load_config("rlt-transformer-8").model) / 1e4) / 100 == 25.31
    assert not any("bias" in n or "wpe" in n for n, _ in model.named_parameters())


def test_block_flops_count_swiglu_three_matrices_and_d_ff():
    cfg = load_config("rlt-transformer-8").model
    d, S = 512, 64
    assert block_flops(cfg, S) == 2 * (4 * d * d + 3 * d * 1365) + 4 * S * d
    gelu = GPT2Config(**{**TINY, "d_ff": 24})
    assert block_flops(gelu, S) == 2 * (4 * 16 * 16 + 2 * 16 * 24) + 4 * S * 16
    assert block_flops(GPT2Config(**TINY), S) == 24 * 16 * 16 + 4 * S * 16


# ---- an independent fp64 reference of the block, from the definitions -------------------------------
def rms(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def ln(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    out = (x - mu) / torch.sqrt((x - mu).pow(2).mean(-1, keepdim=True) + eps) * w
    return out if b is None else out + b


def rope(x, base):
    """x (B, H, T, hd), positions 0..T-1: pair (j, j + hd/2) turns by t base^(-2j/hd)."""
    T, hd = x.shape[-2], x.shape[-1]
    ang = torch.arange(T, dtype=F64)[:, None] * base ** (-2 * torch.arange(hd // 2, dtype=F64) / hd)
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)


def reference_logits(sd, cfg, idx):
    g = lambda k: sd.get(k)  # noqa: E731
    d, H, eps = cfg.d_model, cfg.n_head, cfg.ln_eps
    hd = d // H
    m = d / cfg.mup_base_width if cfg.mup_base_width else 1.0
    norm = (lambda x, p: rms(x, g(p + ".weight"), eps)) if cfg.norm == "rmsnorm" else \
        (lambda x, p: ln(x, g(p + ".weight"), g(p + ".bias"), eps))
    lin = lambda x, p: x @ g(p + ".weight").T + (0 if g(p + ".bias") is None else g(p + ".bias"))  # noqa: E731
    B, T = idx.shape
    h = g("embed.wte.weight")[idx]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.n_layer):
        p = f"blocks.{i}."
        qkv = lin(norm(h, p + "ln_1"), p + "attn.qkv").view(B, T, H, 3, hd)  # per head: q | k | v
        q, k, v = (qkv[:, :, :, j].transpose(1, 2) for j in range(3))       # (B, H, T, hd)
        if cfg.qk_norm:
            q, k = rms(q, g(p + "attn.q_norm.weight"), eps), rms(k, g(p + "attn.k_norm.weight"), eps)
        if cfg.pos_encoding == "rope":
            q, k = rope(q, cfg.rope_base), rope(k, cfg.rope_base)
        scores = (q @ k.transpose(-1, -2)) * math.sqrt(hd / m) / hd   # muP: sqrt(base_hd) / hd
        att = scores.masked_fill(~causal, -math.inf).softmax(-1) @ v
        h = h + lin(att.transpose(1, 2).reshape(B, T, d), p + "attn.proj")
        a = norm(h, p + "ln_2")
        if cfg.mlp == "swiglu":
            up = torch.nn.functional.silu(lin(a, p + "mlp.gate")) * lin(a, p + "mlp.fc")
        else:
            u = lin(a, p + "mlp.fc")
            up = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
        h = h + lin(up, p + "mlp.proj")
    return norm(h, "head.ln_f") @ g("embed.wte.weight").T / m


CASES = {
    "rlt-muP-m2": {**RLT, "mup_base_width": 8},
    "rlt-m1": {**RLT, "mup_base_width": 16},
    "layernorm-gelu-dff-qknorm-m0.5": dict(d_ff=24, qk_norm=True, pos_encoding="none", mup_base_width=32),
    "rmsnorm-gelu-bias": dict(norm="rmsnorm", pos_encoding="rope"),
}


@pytest.mark.parametrize("case", CASES)
def test_logits_equal_fp64_reference(case):
    cfg = GPT2Config(**TINY, **CASES[case])
    model = build_model(cfg, seed=0).double()
    with torch.no_grad():  # non-trivial gains and biases
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    idx = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    got = model(idx).logits
    want = reference_logits({k: v for k, v in model.state_dict().items()}, cfg, idx)
    assert got.shape == want.shape == (2, 9, 16)
    err = (got - want).abs().max().item()
    assert err < 1e-12, err


def test_mup_at_base_width_is_standard_parametrisation_bitwise():
    sp, m1 = (build_model(GPT2Config(**TINY, **RLT, mup_base_width=w), seed=3) for w in (0, 16))
    idx = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(2))
    assert all(torch.equal(a, b) for a, b in zip(sp.state_dict().values(), m1.state_dict().values()))
    assert torch.equal(sp(idx).logits, m1(idx).logits)
    tc = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, max_steps=10)
    assert [len(g["params"]) for g in make_optimizer(m1, tc).param_groups] == \
        [len(g["params"]) for g in make_optimizer(sp, tc).param_groups] == [1 + 2 * 5, 2 * 4 + 1]


HIDDEN = ("attn.qkv.weight", "attn.proj.weight", "mlp.gate.weight", "mlp.fc.weight", "mlp.proj.weight")


def test_mup_init_std_and_learning_rate_per_group():
    """m = 256 / 64 = 4: hidden matrices init with std / 2 (residual projections 0.02 / sqrt(2 n_layer)
    / 2) and train at lr / 4 through the whole schedule; embeddings and gains keep std and lr."""
    cfg = GPT2Config(vocab_size=11, block_size=8, d_model=256, n_head=4, n_layer=1, mup_base_width=64, **{**RLT, "d_ff": 512})
    model = build_model(cfg, seed=0)
    want_std = {"attn.qkv.weight": 0.01, "attn.proj.weight": 0.02 / math.sqrt(2) / 2, "mlp.gate.weight": 0.01,
                "mlp.fc.weight": 0.01, "mlp.proj.weight": 0.02 / math.sqrt(2) / 2}
    for name, std in want_std.items():
        got = model.get_parameter(f"blocks.0.{name}").std().item()
        assert abs(got / std - 1) < 0.02, (name, got, std)  # >= 65k samples: standard error < 0.3%
    assert abs(model.embed.wte.weight.std().item() / 0.02 - 1) < 0.06  # 2,816 samples: 1.3%
    tc = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, max_steps=10, weight_decay=0.1)
    opt = make_optimizer(model, tc)
    sched = make_scheduler(opt, tc)
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    for step in range(12):
        for name, p in model.named_parameters():
            g = group_of[id(p)]
            hidden = name.endswith(HIDDEN)
            assert g["lr"] == pytest.approx(lr_at(step, tc) / (4 if hidden else 1), rel=1e-12), (name, step)
            assert g["weight_decay"] == (0.1 if p.dim() >= 2 else 0.0), name
        assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(step, tc), rel=1e-12)  # what the trainer logs
        opt.step(), sched.step()
    assert sum(name.endswith(HIDDEN) for name, _ in model.named_parameters()) == 5


def test_debug_flavour_transfers_the_papers_learning_rate():
    """rlt-transformer-debug (width 128, base 512: m = 1/4): hidden lr 4 x lr, logits x 4."""
    model = build_model(load_config("rlt-transformer-debug").model, seed=0)
    opt = make_optimizer(model, TrainConfig(lr=1e-4, min_lr=5e-6, warmup_steps=200, max_steps=2000))
    assert sorted({g["lr"] for g in opt.param_groups}) == [1e-4, 4e-4]
    assert model.head.logit_scale == 4.0 and model.blocks[0].attn.scale == math.sqrt(128) / 32


def test_cached_decoding_equals_recomputation():
    model = build_model(GPT2Config(**TINY, **RLT, mup_base_width=8), seed=0).double().eval()
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(4))
    full = model(idx).logits
    cache = model.make_cache()
    steps = [model(idx[:, :3], cache=cache).logits] + [model(idx[:, t:t + 1], cache=cache).logits for t in range(3, 8)]
    assert (torch.cat(steps, 1) - full).abs().max().item() < 1e-12


@pytest.mark.parametrize("fields, message", [
    (dict(mlp="swiglu"), r"model.mlp='swiglu' needs model.d_ff > 0"),
    (dict(d_ff=-3), r"model.d_ff=-3 must be >= 0"),
    (dict(d_ff=2**18 + 1), r"model.d_ff=262145 must be <= 262144"),
    (dict(norm="batchnorm"), r"model.norm='batchnorm' is not one of layernorm, rmsnorm"),
    (dict(mlp="relu"), r"model.mlp='relu' is not one of gelu, swiglu"),
    (dict(mup_base_width=-1), r"model.mup_base_width=-1 must be >= 0"),
    (dict(mup_base_width=7), r"model.mup_base_width=7 is not divisible by model.n_head=2"),
])
def test_bad_combinations_are_refused_naming_the_value(fields, message):
    problems = GPT2Config(**{**TINY, **fields}).problems("model")
    assert len(problems) == 1 and re.search(message, problems[0]), problems


def test_layers_refuse_a_hand_edited_config():
    """An export's config.json reaches the layers without ModelConfig.problems."""
    from rgpt_dist.models.block_options import ffn_width, layer_norm, mup_width_mult

    base = dict(d_model=16, ln_eps=1e-5, bias=True)
    with pytest.raises(ValueError, match="norm='batchnorm'"):
        layer_norm(types.SimpleNamespace(**base, norm="batchnorm"))
    with pytest.raises(ValueError, match="d_ff=0 must be an integer >= 1"):
        ffn_width(types.SimpleNamespace(**base, mlp="swiglu", d_ff=0))
    with pytest.raises(ValueError, match="d_ff=-3 must be an integer >= 1"):
        ffn_width(types.SimpleNamespace(**base, d_ff=-3))
    with pytest.raises(ValueError, match="mlp='relu'"):
        ffn_width(types.SimpleNamespace(**base, mlp="relu"))
    with pytest.raises(ValueError, match="mup_base_width=-2"):
        mup_width_mult(types.SimpleNamespace(**base, mup_base_width=-2))
    assert ffn_width(types.SimpleNamespace(**base)) == 64 and mup_width_mult(types.SimpleNamespace(**base)) is None


def test_hf_dense_export_refuses_the_rlt_block(tmp_path):
    from rgpt_dist.checkpoints.consolidate import ExportError
    from rgpt_dist.export.hf_dense import write_hf_gpt2

    cfg = GPT2Config(**{**TINY, **RLT, "pos_encoding": "learned", "mup_base_width": 8})
    model = build_model(cfg, seed=0)
    with pytest.raises(ExportError, match=r"model.norm='rmsnorm', model.mlp='swiglu', model.qk_norm=True, "
                                          r"model.mup_base_width=8 .*GPT2LMHeadModel"):
        write_hf_gpt2(model.state_dict(), cfg, tmp_path / "hf", dtype=torch.float32)
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_tp2_equals_tp1(tmp_path):
    """tp = 2 (heads, SwiGLU's hidden features split; QK-norm's gains replicated, their gradient summed
    over the ranks' heads) against tp = 1, within tests/helpers/tolerance.py's tp bounds (from a float64 twin)."""
    import json

    from tests.helpers.dist import torchrun
    from tests.helpers.tolerance import tp_matches

    torchrun("tests.models.tp_rlt_baseline", 2, str(tmp_path / "out"))
    for rank in (0, 1):
        got = json.loads((tmp_path / f"out.{rank}.json").read_text())["gpt2/rlt"]
        assert tp_matches(got), (rank, got)
        assert got["roundtrip_bitwise"] and got["n_params"] == 1 + 2 * 9 + 1, got


def test_compiled_block_has_no_graph_break_and_trains_like_eager():
    """parallel.compile=blocks (aot_eager: eager's kernels) on the RLT block: no graph break, and the
    loss and gradients equal eager's (as tests/parallel/test_compile.py)."""
    import copy

    from torch._dynamo.utils import counters

    from rgpt_dist.parallel.compile import apply_compile, compile_stats

    torch._dynamo.reset()
    counters.clear()
    try:
        eager = build_model(GPT2Config(**TINY, **RLT, mup_base_width=8), seed=0).train()
        compiled = copy.deepcopy(eager)
        apply_compile(compiled, "blocks", backend="aot_eager")
        x, y = torch.randint(0, 11, (2, 9)), torch.randint(0, 11, (2, 9))
        for model in (eager, compiled):
            model(x, y).loss.backward()
        assert compile_stats()["graph_breaks"] == 0 and compile_stats()["compiled_frames"] >= 2
        assert compiled(x, y).loss.item() == pytest.approx(eager(x, y).loss.item(), rel=3e-7, abs=0)
        for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=2e-7, msg=name)
    finally:
        torch._dynamo.reset()


def test_hf_dense_export_of_a_gelu_mlp_of_another_width(tmp_path):
    """d_ff != 4d with GELU is GPT-2's n_inner: the stock GPT2LMHeadModel computes our logits."""
    from transformers import GPT2LMHeadModel

    from rgpt_dist.export.hf_dense import write_hf_gpt2
    from tests.helpers.hf import isolated_hf

    cfg = GPT2Config(**{**TINY, "pad_vocab_multiple": 1, "d_ff": 24})
    model = build_model(cfg, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    idx = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(5))
    with isolated_hf(tmp_path / "home"):
        write_hf_gpt2(model.state_dict(), cfg, tmp_path / "hf", dtype=torch.float32)
        hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.n_inner == 24
    with torch.no_grad():
        err = (hf(idx).logits - model(idx).logits).abs().max().item()
    assert err < 1e-6, err  # measured 1.5e-7 (fp32, logits of magnitude ~1)


def test_relaxed_refuses_another_mlp():
    """RRT's LoRA adapters are shaped for the 4 d GELU MLP: another MLP is a config error, by name."""
    from rgpt_dist.config import RelaxedConfig

    for fields in (dict(mlp="swiglu", d_ff=24), dict(d_ff=24)):
        problems = RelaxedConfig(vocab_size=11, d_model=16, n_head=2, lora_rank=2, **fields).problems("model")
        assert any(f"model.d_ff=24: RRT's LoRA" in p for p in problems), problems
    assert RelaxedConfig(vocab_size=11, d_model=16, n_head=2, lora_rank=2, d_ff=64).problems("model") == []


@pytest.mark.parametrize("family", ["recurrent_gpt", "ouro", "poisson", "mor"])
def test_looped_families_take_the_block_options_and_count_them(family):
    """The options live in the shared layers: a looped family builds, runs, and rgpt-flops counts
    its parameters (RMSNorm gains in its own norms included)."""
    from rgpt_dist.models.spec import spec_for

    cfg = spec_for(family).config(vocab_size=11, block_size=16, d_model=16, n_head=2, n_pre=1, n_rec=1, n_coda=1,
                                  n_loops=2, **{**RLT, "bias": True}, mup_base_width=8)
    model = build_model(cfg, seed=0)
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg)
    assert torch.isfinite(model(torch.randint(0, 11, (2, 5)), torch.randint(0, 11, (2, 5))).loss)
