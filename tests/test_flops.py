import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from rgpt_dist.config import FLAVOURS, GPT2Config, RecurrentGPTConfig, load_config
from rgpt_dist.flops import (paper_table1, block_executions, executed_forward_flops, forward_flops, gpu_hours,
                             head_flops, param_count, report, solve_isoflops, total_train_flops, train_flops)
from rgpt_dist.registry import build_model


@pytest.mark.parametrize("name", [n for n, f in FLAVOURS.items() if f["family"] != "thinking"])  # language models
def test_analytic_parameter_count_equals_the_model(name):
    cfg = load_config(name).model
    with torch.device("meta"):  # no memory: the large cells have ~780M parameters
        model = build_model(cfg)
    assert param_count(cfg) == sum(p.numel() for p in model.parameters())
    emb = sum(p.numel() for p in model.embed.parameters())  # wte, and wpe where pos_encoding is learned
    assert param_count(cfg, embeddings=False) == sum(p.numel() for p in model.parameters()) - emb


@pytest.mark.parametrize("name", ["recurrentgpt-large-isoflops", "recurrentgpt-medium-isoparams",
                                  "recurrentgpt-large-isoparams", "gpt2-small", "gpt2-medium", "gpt2-large"])
def test_paper_params_column_within_two_percent(name):
    ours = param_count(load_config(name).model)
    assert abs(ours / paper_table1()[name][0] - 1) < 0.02


def test_small_and_medium_isoflops_do_not_match_the_paper_and_are_flagged():
    """SPEC section 3: the paper's 36M/124M do not follow from the stated layouts; we count honestly."""
    for name, approx in (("recurrentgpt-small-isoflops", 63.6e6), ("recurrentgpt-medium-isoflops", 171.1e6)):
        cfg = load_config(name).model
        assert abs(param_count(cfg) / approx - 1) < 0.001
        row = report(name, cfg, 1024, load_config(name.replace("recurrentgpt", "gpt2").rsplit("-", 1)[0]).model)
        assert any("vs paper" in f and "params" in f for f in row["flags"])


def test_eq1_ratios_at_1024_match_the_spec():
    ratio = {}
    for name, dense in (("recurrentgpt-small-isoflops", "gpt2-small"), ("recurrentgpt-medium-isoflops", "gpt2-medium"),
                        ("recurrentgpt-large-isoflops", "gpt2-large")):
        rec, den = load_config(name).model, load_config(dense).model
        assert block_executions(rec) == block_executions(den)
        ratio[name] = forward_flops(rec, 1024) / forward_flops(den, 1024)
    assert round(ratio["recurrentgpt-small-isoflops"], 3) == 1.284
    assert round(ratio["recurrentgpt-medium-isoflops"], 2) == 1.06
    assert round(ratio["recurrentgpt-large-isoflops"], 2) == 1.06


def counted_flops(model, B, S, **kwargs):
    idx = torch.zeros(B, S, dtype=torch.long)
    # The math SDPA backend runs the score and value matmuls in full (as the paper counts them) and
    # as bmm ops the counter sees; the CPU fused kernel is not known to FlopCounterMode.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        model.eval()(idx, **kwargs)
    return counter.get_total_flops()


SMALL = dict(vocab_size=512, block_size=128, d_model=64, n_head=4)
B, S = 2, 96


def test_eq1_agrees_with_torch_flop_counter_dense():
    cfg = GPT2Config(n_layer=3, **SMALL)
    measured = counted_flops(build_model(cfg, seed=0), B, S)
    assert abs(measured / (B * S * (forward_flops(cfg, S) + head_flops(cfg))) - 1) < 0.02


def test_eq1_agrees_with_torch_flop_counter_recurrent_at_r1():
    """At r = 1 the implementation runs exactly Eq. 1's matmuls (W_proj and both gate layers once)."""
    cfg = RecurrentGPTConfig(n_pre=1, n_rec=2, n_coda=1, n_loops=4, **SMALL)
    measured = counted_flops(build_model(cfg, seed=0), B, S, r=1)
    assert abs(measured / (B * S * (forward_flops(cfg, S, 1) + head_flops(cfg))) - 1) < 0.02


@pytest.mark.parametrize("r", [0, 1, 3, 6])
def test_executed_flops_agree_with_torch_flop_counter(r):
    cfg = RecurrentGPTConfig(n_pre=1, n_rec=2, n_coda=1, n_loops=4, **SMALL)
    measured = counted_flops(build_model(cfg, seed=0), B, S, r=r)
    predicted = B * S * (executed_forward_flops(cfg, S, r) + head_flops(cfg))
    assert abs(measured / predicted - 1) < 0.01, (measured, predicted)
    if r > 1:  # hoisting the h_pre halves out of the loop saves (r - 1) * 4 d^2 per token
        saved = B * S * (forward_flops(cfg, S, r) - executed_forward_flops(cfg, S, r))
        assert saved == B * S * (r - 1) * 4 * cfg.d_model ** 2


def test_train_flops_use_expected_depth():
    cfg = load_config("recurrentgpt-medium-isoflops").model  # Uniform{1..4}: E[r] = 2.5
    assert train_flops(cfg, 1024) == pytest.approx(3 * (forward_flops(cfg, 1024, 2.5) + head_flops(cfg)))
    fixed = load_config("recurrentgpt-medium-isoflops", ["model.depth_sampler=fixed"]).model
    assert train_flops(fixed, 1024) == pytest.approx(3 * (forward_flops(cfg, 1024, 4) + head_flops(cfg)))


def test_solver_finds_the_isoflops_depth():
    dense = load_config("gpt2-medium").model
    out = solve_isoflops(dense, 2, 2, 1024, n_rec=5)
    assert out["block_matched"] == 4
    assert 3 < out["exact"] < 4  # the 10 d^2 per-step term pushes the exact match below the block match
    rec = RecurrentGPTConfig(d_model=1024, n_head=16, n_pre=2, n_rec=5, n_coda=2, n_loops=4)
    four = next(c for c in out["candidates"] if c["value"] == 4)
    assert four["ratio"] == pytest.approx(forward_flops(rec, 1024) / forward_flops(dense, 1024))
    out = solve_isoflops(dense, 2, 2, 1024, n_loops=4)
    assert 4 < out["exact"] < 5 and out["block_matched"] == 5
    with pytest.raises(ValueError, match="exactly one"):
        solve_isoflops(dense, 2, 2, 1024)


def test_gpu_hours_against_a_hand_computation():
    """recurrentgpt-medium-isoflops (2+5x4+2, d=1024, V=50,257, Uniform{1..4}: E[r] = 2.5) at S=1024,
    20,000 steps of 480 x 1024 tokens, worked out by hand:
    block 24 d^2 + 4 S d = 25,165,824 + 4,194,304 = 29,360,128; blocks run 2 + 5 x 2.5 + 2 = 16.5
    -> 484,442,112; recurrence 2.5 x 10 d^2 = 26,214,400; head 2 d V = 102,926,336;
    forward 613,582,848 per token, training x3 = 1,840,748,544 per token."""
    cfg = load_config("recurrentgpt-medium-isoflops").model
    tokens = 20_000 * 480 * 1024
    assert tokens == 9_830_400_000
    total = 1_840_748_544 * tokens
    assert total_train_flops(cfg, 1024, 20_000, 480 * 1024) == pytest.approx(total, rel=1e-12)
    hours = gpu_hours(cfg, 1024, 20_000, 480 * 1024, 989e12, 0.4)
    assert hours == pytest.approx(total / (989e12 * 0.4) / 3600, rel=1e-12)
    assert round(hours, 2) == 12.71  # 1.8095e19 FLOPs / 3.956e14 FLOP/s = 45,742 s
    assert gpu_hours(cfg, 1024, 40_000, 480 * 1024, 989e12, 0.2) == pytest.approx(4 * hours)  # linear in steps, 1/mfu


def test_gpu_hours_of_a_dense_model_and_bad_arguments():
    cfg = load_config("gpt2-small").model  # 12 x (24 d^2 + 4 S d) + 2 d V at d=768, S=1024
    per_token = 3 * (12 * (24 * 768 ** 2 + 4 * 1024 * 768) + 2 * 768 * 50257)
    assert gpu_hours(cfg, 1024, 1000, 4096, 1e15, 0.5) == pytest.approx(per_token * 4096 * 1000 / 5e14 / 3600)
    assert total_train_flops(cfg, 1024, 0, 4096) == 0
    for bad in (dict(mfu=0), dict(mfu=1.5), dict(peak_flops_per_gpu=0)):
        with pytest.raises(ValueError):
            gpu_hours(cfg, 1024, 1000, 4096, **{"peak_flops_per_gpu": 1e15, "mfu": 0.5, **bad})
    with pytest.raises(ValueError):
        total_train_flops(cfg, 1024, -1, 4096)


@pytest.mark.parametrize("kwargs,message", [
    (dict(n_rec=0), "n_rec=0 must be an integer >= 1"),
    (dict(n_loops=0), "n_loops=0 must be an integer >= 1"),
    (dict(n_rec=-3), "n_rec=-3 must be an integer >= 1"),
    (dict(n_rec=5, n_pre=-1), "n_pre=-1 must be an integer >= 0"),
    (dict(n_rec=5, seq_len=0), "seq_len=0 must be an integer >= 1"),
])
def test_solver_refuses_zero_or_negative_sizes_naming_them(kwargs, message):
    dense = load_config("gpt2-medium").model
    args = {"n_pre": 2, "n_coda": 2, "seq_len": 1024, **kwargs}
    with pytest.raises(ValueError, match=message):
        solve_isoflops(dense, args.pop("n_pre"), args.pop("n_coda"), args.pop("seq_len"), **args)


def test_report_and_costs_refuse_a_zero_sequence_length_and_infinite_peak():
    cfg = load_config("gpt2-small").model
    with pytest.raises(ValueError, match="seq_len=0 must be an integer >= 1"):
        report("gpt2-small", cfg, 0, None)
    with pytest.raises(ValueError, match="seq_len=-1 must be an integer >= 1"):
        total_train_flops(cfg, -1, 10, 4096)
    with pytest.raises(ValueError, match="peak_flops_per_gpu=inf must be a finite number > 0"):
        gpu_hours(cfg, 1024, 10, 4096, float("inf"), 0.5)


# ---- the looped scaling law's parameter split (SPEC section 10, issue #26) -------------------------
def _gpt2_block(d):
    """GPT-2 block: qkv 3d^2 + 3d, out d^2 + d, MLP 8d^2 + 5d, two LayerNorms 4d."""
    return 12 * d * d + 13 * d


def _rlt_layers(c):
    """RLT (RMSNorm, SwiGLU of width f, QK-norm, no biases): an encoder block 4d^2 + 3df + 2d + 2hd;
    a decoder layer adds cross q/out 2d^2, its q-norm hd and a third norm d; a memory group W_K W_V
    2d^2, input norm d, key norm hd; the merge W_g 2d^2 + b_g d, W_s d^2, RMSNorm_s d, s* d; final norm d."""
    d, f, hd = c.d_model, c.d_ff, c.d_model // c.n_head
    block = 4 * d * d + 3 * d * f + 2 * d + 2 * hd
    merge = 3 * d * d + 3 * d if c.feedback_interval else 0
    return (c.n_enc * block + c.n_dec * (block + 2 * d * d + hd + d) + c.mem_groups * (2 * d * d + d + hd)
            + merge + d)


def expected_split(c):
    """(N_once, N_rec) by formula, from the papers' definitions: N_rec = the shared core's blocks plus
    what runs at every step with the same weights; everything else non-embedding is N_once."""
    d, ln = c.d_model, 2 * c.d_model
    if c.family == "gpt2":
        return c.n_layer * _gpt2_block(d) + ln, 0
    if c.family == "rlt":  # recurrence over time, not depth: no N_rec
        return _rlt_layers(c), 0
    if c.family == "rt":  # RMSNorm, QK-norm, no biases, GELU 4d; the untied head is an embedding; no N_rec
        return c.n_layer * (12 * d * d + 2 * d + 2 * (d // c.n_head)) + d, 0
    once = (c.n_pre + c.n_coda) * _gpt2_block(d) + ln
    core = c.n_rec * _gpt2_block(d)
    extra = {  # (shared at every step -> N_rec, not shared or off the state's path -> N_once)
        "recurrent_gpt": lambda: (2 * d * d + (3 * d * d + 2 * d) + 2 * ln, 0),  # W_proj; gate MLP; its LNs
        "poisson": lambda: (2 * d * d, 0),                                      # the adapter [s; e] -> d
        "mor": lambda: (0, c.n_loops * d),                                      # a router w_i per recursion
        "ouro": lambda: (0, ln + d + 1),                                        # exit gate on the coda output
        "relaxed": lambda: (0, c.n_loops * c.n_rec * c.lora_rank * 16 * d),     # each loop's own LoRA
    }[c.family]()
    return once + extra[1], core + extra[0]


SPLIT_FLAVOURS = ["gpt2-debug", "recurrentgpt-debug", "poisson-debug", "mor-debug", "ouro-debug", "rrt-debug",
                  "rlt1-debug", "gpt2-small", "recurrentgpt-small-isoflops", "poisson-small-isoflops",
                  "mor-small-isoflops", "ouro-small-isoflops", "rrt-small-isoflops", "rlt1-4+4", "rt-debug",
                  "rt-300m-12l"]
REC_MODULES = {"gpt2": (), "rlt": (), "rt": (), "recurrent_gpt": ("recurrence.",), "poisson": ("recurrence.",),
               "mor": ("recurrence.blocks.",), "ouro": ("recurrence.blocks.",), "relaxed": ("recurrence.blocks.",)}
"""Per family, the modules whose parameters are N_rec: the shared core (+ per-step modules inside it)."""


def test_every_family_is_in_the_split_test():
    from rgpt_dist.models.spec import families

    assert set(REC_MODULES) == set(families())
    assert {load_config(name).model.family for name in SPLIT_FLAVOURS} == set(families())


@pytest.fixture(scope="module")
def flops_json():
    """rgpt-flops --json of every flavour of the split test: name -> row."""
    import contextlib
    import io
    import json

    from launcher.flops import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*SPLIT_FLAVOURS, "--json"]) == 0
    return {row["name"]: row for row in json.loads(out.getvalue())}


@pytest.mark.parametrize("name", SPLIT_FLAVOURS)
def test_param_split_equals_the_formula_the_built_model_and_rgpt_flops(name, flops_json):
    from rgpt_dist.flops import param_split

    cfg = load_config(name).model
    n_once, n_rec = param_split(cfg)
    assert (n_once, n_rec) == expected_split(cfg)
    assert n_once + n_rec == param_count(cfg, embeddings=False)
    with torch.device("meta"):
        model = build_model(cfg)
    groups = {"once": 0, "rec": 0}
    for pname, p in model.named_parameters():  # tied head: counted once, as wte
        if not pname.startswith("embed."):
            groups["rec" if pname.startswith(REC_MODULES[cfg.family]) else "once"] += p.numel()
    assert (groups["once"], groups["rec"]) == (n_once, n_rec)
    assert (flops_json[name]["params_once"], flops_json[name]["params_rec"]) == (n_once, n_rec)


def test_rgpt_flops_table_has_the_split_columns(capsys):
    from launcher.flops import main

    assert main(["poisson-debug"]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    cells = dict(zip(header.split(), row.split()))
    once, rec = expected_split(load_config("poisson-debug").model)
    assert (cells["params_once"], cells["params_rec"]) == (f"{once:,}", f"{rec:,}")
