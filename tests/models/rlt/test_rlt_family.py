"""RLT as a registered family (issue 25, deliverable 2) beyond tests/models/test_family_contract.py:
it trains under the real launcher (two ranks at ZeRO-2 and at ZeRO-3 reproduce one rank, a run stopped and resumed
equals the uninterrupted one), what it declares unsupported is refused before any work (tensor
parallelism and compile=model by config validation; ZeRO-3 is accepted), rgpt-export writes the native and Hugging
Face exports of a run, which reload and generate as the checkpoint does, and its FLOPs per
token: Eq. 1 against a count written here from the paper's architecture, the executed count of
RLT-2 and RLT-0 against torch's counter (the contract checks RLT-1's).

One module-scoped set of three tiny runs (rlt1-debug: width 32, 2 + 2 layers, parity, 4 steps) and
one of two for ZeRO-3 (rlt2-debug, B = 2: half RLT-1's chunks, see `zero3_runs`)."""
from __future__ import annotations

import shutil

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.checkpoints.consolidate import consolidate
from rgpt_dist.export.exporter import export
from rgpt_dist.flops import executed_forward_flops, forward_flops, head_flops
from rgpt_dist.models.rlt import SPEC
from rgpt_dist.registry import build_model
from tests.helpers.dist import torchrun
from tests.helpers.replay import replay, twin_bounds
from tests.helpers.tolerance import fp32_bound, max_abs
from tests.helpers.runs import plant_stale_records, records, resumed_line, trajectory

CONFIG = "configs/algorithmic/parity.yaml"
STEPS = 4
# fp32 on CPU; 8 examples per step: one rank accumulates 2 micro-batches of 4, two ranks take one each
ARGS = ["model=rlt1-debug", "model.vocab_size=8", "model.block_size=48", "train.micro_batch_size=4",
        "train.global_batch_size=8", f"train.max_steps={STEPS}", "train.warmup_steps=1",
        "parallel.zero_stage=2", "parallel.dtype=fp32", "parallel.compile=none", "checkpoint.every_steps=2",
        "checkpoint.keep_last=2", "checkpoint.keep_best=false", "eval.every_steps=0", "log.every_steps=1",
        "log.wandb=disabled"]



def launch(nproc, run, *extra):
    return torchrun("launcher.train", nproc, CONFIG, *ARGS, *extra, f"log.run_dir={run}", timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(one rank, two ranks, resumed, the resumed run's stdout). The two-rank run also recomputes the
    encoder blocks in backward (activation_checkpointing=recurrence: RLT's checkpoint units). The
    resumed run is the one-rank run rewound to its step-2 checkpoint (the step-4 one deleted, stale
    records planted after step 2), launched again."""
    root = tmp_path_factory.mktemp("rlt")
    one, two, resumed = root / "one", root / "two", root / "resumed"
    launch(1, one, "parallel.activation_checkpointing=none")
    launch(2, two, "parallel.activation_checkpointing=recurrence")
    shutil.copytree(one, resumed)
    shutil.rmtree(resumed / "checkpoints" / f"step_{STEPS:08d}")
    (resumed / "checkpoints" / "latest").write_text("step_00000002")
    plant_stale_records(resumed, after=2)
    return one, two, resumed, launch(1, resumed, "parallel.activation_checkpointing=none")


def assert_reproduces(one, two):
    """`two` (2 ranks) trained like `one` (1 rank): losses and gradient norms at every step, and the
    consolidated weights, within the bounds of `one`'s float64 twin (tests/helpers/replay.py: 4x the
    one-rank run's distance from it plus 4 float32 ulps; the weights by tolerance.fp32_bound). A
    gradient summed instead of averaged over the ranks doubles the norm; a lost one moves a weight by
    about lr = 1e-4 per step."""
    twin = replay(one, torch.float64)
    rel, grad_norm_rel = twin_bounds(records(one), twin)
    (got, _), (ref, _) = trajectory(records(two)), trajectory(records(one))
    assert [s for s, *_ in got] == [s for s, *_ in ref] == list(range(1, STEPS + 1))
    for (step, _, loss, norm, lr, _), (_, _, loss_ref, norm_ref, lr_ref, _) in zip(got, ref):
        assert loss == pytest.approx(loss_ref, rel=rel) and lr == pytest.approx(lr_ref, rel=1e-12), step
        assert norm == pytest.approx(norm_ref, rel=grad_norm_rel), step
    a, b = consolidate(one), consolidate(two)
    assert a.step == b.step == STEPS and set(a.state_dict) == set(b.state_dict)
    bound = fp32_bound(max(max_abs(a.state_dict[k], twin.weights[k]) for k in a.state_dict),
                       max(v.abs().max().item() for v in twin.weights.values()))
    for name in a.state_dict:
        assert max_abs(b.state_dict[name], a.state_dict[name]) <= bound, name
    return ref


def test_two_ranks_at_zero2_reproduce_one_rank(runs):
    one, two, _, _ = runs
    ref = assert_reproduces(one, two)
    assert ref[-1][2] < ref[0][2]  # it learns


@pytest.fixture(scope="module")
def zero3_runs(tmp_path_factory):
    """(one rank at ZeRO-2, two ranks at ZeRO-3 recomputing the encoder blocks in backward), rlt2-debug.
    At ZeRO-3 every weight matrix here is partitioned (the old merge, which sliced W_g outside its
    Linear's forward, failed in the first backward: "size of tensor a (0) must match ... (64)").
    RLT-2 at B = 2 (41 positions: 20 chunks + a partial one) rather than RLT-1: DeepSpeed's first step
    on a complete module trace scans the rest of the trace at every module release (quadratic in the
    ~n_dec x 10 module calls per chunk; 2026-12-03: 43 s for RLT-1's 41 chunks, 18 s for these 21)."""
    root = tmp_path_factory.mktemp("rlt-zero3")
    args = ["model=rlt2-debug" if a == "model=rlt1-debug" else a for a in ARGS]
    one, two = root / "one", root / "two"
    torchrun("launcher.train", 1, CONFIG, *args, "parallel.activation_checkpointing=none", f"log.run_dir={one}",
             timeout=300)
    torchrun("launcher.train", 2, CONFIG, *args, "parallel.zero_stage=3",
             "parallel.activation_checkpointing=recurrence", f"log.run_dir={two}", timeout=300)
    return one, two


def test_two_ranks_at_zero3_reproduce_one_rank(zero3_runs):
    """The consolidated ZeRO-3 weights after 4 steps equal the one-rank run's (every parameter, the
    merge's gate_e, gate_s, W_s and s* among them), and so do the losses and gradient norms."""
    one, two = zero3_runs
    assert_reproduces(one, two)
    assert {"merge.gate_e.weight", "merge.gate_e.bias", "merge.gate_s.weight", "merge.s0"} <= set(consolidate(one).state_dict)


def test_a_resumed_run_equals_the_uninterrupted_one(runs):
    one, _, resumed, out = runs
    assert resumed_line(resumed, 2) in out
    assert trajectory(records(resumed)) == trajectory(records(one))
    a, b = consolidate(one), consolidate(resumed)
    assert a.step == b.step == STEPS
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)


def test_rgpt_export_reloads_and_generates_as_the_checkpoint(runs, tmp_path):
    """Issue 25's "export + reload + generate" on the trained run: the native export and the Hugging
    Face one (its remote code this checkout's, so rgpt-eval's default policy runs it) give the
    checkpoint's logits and its cached greedy generation (tests/export/test_hf_rlt.py: the rest)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rgpt_dist.checkpoints.native import load_native
    from rgpt_dist.export.remote_code import trust_remote_code
    from rgpt_dist.models.generate import generate
    from tests.helpers.hf import isolated_hf

    out = export(runs[0], tmp_path / "export")
    c = consolidate(runs[0])
    model = build_model(c.config.model).eval()
    model.load_state_dict(c.state_dict)
    native, record = load_native(out / "native")
    idx = torch.randint(0, 8, (2, 11), generator=torch.Generator().manual_seed(0))
    with isolated_hf(tmp_path / "home"), torch.no_grad():
        hf = AutoModelForCausalLM.from_pretrained(out / "hf", trust_remote_code=trust_remote_code(out / "hf")).eval()
        logits = hf(idx).logits
        # the export's eos is the task's (2): finished rows padded with it, as the native generate pads them
        seq = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=12, do_sample=False, pad_token_id=2)
        # the run's task's tokenizer (parity: <pad> <bos> <eos> 0 1), not GPT-2's
        assert AutoTokenizer.from_pretrained(out / "hf")("<bos>0110").input_ids == [1, 3, 4, 4, 3]
        assert (hf.config.bos_token_id, hf.config.eos_token_id, hf.config.pad_token_id) == (1, 2, 0)
    with torch.no_grad():
        expected = model(idx).logits
        assert record["step"] == STEPS and torch.equal(native(idx).logits, expected)
    torch.testing.assert_close(logits, expected[..., :8], atol=0, rtol=0)  # measured: equal
    assert torch.equal(seq, generate(model, idx, 12, strategy="full", eos_token_id=2))


@pytest.mark.parametrize("override, named", [
    ("parallel.tp_size=2", "parallel.tp_size=2: model family 'rlt' does not support tensor parallelism: no tp = 2"),
    ("parallel.compile=model", "parallel.compile=model is not supported by model family 'rlt'")])
def test_config_validation_refuses_what_rlt_cannot_run(override, named):
    with pytest.raises(ConfigError) as refused:
        load_config(CONFIG, [*ARGS, override])
    assert named in str(refused.value)
    load_config(CONFIG, [*ARGS, "parallel.compile=blocks", "parallel.activation_checkpointing=selective"])


@pytest.mark.parametrize("flavour", ["rlt1-debug", "rlt2-debug", "rlt0-debug"])
def test_config_validation_accepts_zero3(flavour):
    """ZeRO-3 is no longer refused (every weight is read inside its own module's forward), eager or with
    the encoder Blocks compiled; compile=model stays refused under it."""
    for extra in ("parallel.compile=none", "parallel.compile=blocks"):
        cfg = load_config(CONFIG, [*ARGS, f"model={flavour}", "parallel.zero_stage=3", extra])
        assert (cfg.model.family, cfg.parallel.zero_stage) == ("rlt", 3)
        assert SPEC.run_problems(cfg) == []
    with pytest.raises(ConfigError, match="parallel.compile=model is not supported by model family 'rlt'"):
        load_config(CONFIG, [*ARGS, f"model={flavour}", "parallel.zero_stage=3", "parallel.compile=model"])


def test_eq1_flops_count_the_window_and_memory_reads():
    """Per token at S positions, from the architecture (paper section 2): the encoder's blocks as
    Eq. 1's (8 d^2 + 6 d f + 4 S d, SwiGLU); per decoder layer q, k, v, out (8 d^2), cross-attention
    q and out (4 d^2), the FFN (6 d f), window reads min(W, t) and memory reads t keys (scores and
    values: 4 d each); the memory's W_K, W_V (4 d^2); the merge: W_g's token half every position
    (2 d^2), its state half and W_s once per chunk of B (4 d^2 / B)."""
    S = 40
    for name, B in (("rlt1-4+4", 1), ("rlt2-4+4", 4), ("rlt0-4+4", 0)):
        cfg = load_config(name).model
        d, f, W = 512, 1365, 8
        encoder = 4 * (8 * d * d + 6 * d * f + 4 * S * d)
        reads = sum(min(W, t) + t for t in range(1, S + 1)) / S
        decoder = 4 * (8 * d * d + 4 * d * d + 6 * d * f + 4 * d * reads)
        merge = 0 if B == 0 else 2 * d * d + 4 * d * d / B
        assert forward_flops(cfg, S) == pytest.approx(encoder + decoder + 4 * d * d + merge, rel=1e-12), name
        assert head_flops(cfg) == 2 * d * 277


@pytest.mark.parametrize("flavour, T", [("rlt2-debug", 13), ("rlt0-debug", 13), ("rlt2-debug", 48)])
def test_executed_flops_match_torch_counter(flavour, T):
    """RLT-2 with a partial last chunk (13 = 6 x 2 + 1) and RLT-0 (one chunk of all T positions, a
    window ring of W - 1 = 7 slots in front): the counted matmuls of a training forward."""
    cfg = load_config(flavour, ["model.vocab_size=64", "model.block_size=64", "train.seq_len=64"]).model
    model = build_model(cfg, seed=0).train()
    idx = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(0))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(idx)
    assert counter.get_total_flops() == pytest.approx(idx.numel() * (executed_forward_flops(cfg, T) + head_flops(cfg)),
                                                      rel=1e-9)
