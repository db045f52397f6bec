"""RLT as a registered family (issue 25, deliverable 2) beyond tests/models/test_family_contract.py:
it trains under the real launcher (two ranks at ZeRO-2 reproduce one rank, a run stopped and resumed
equals the uninterrupted one), what it declares unsupported is refused before any work (tensor
parallelism, compile=model and ZeRO-3 by config validation, rgpt-export writes nothing), and its FLOPs per
token: Eq. 1 against a count written here from the paper's architecture, the executed count of
RLT-2 and RLT-0 against torch's counter (the contract checks RLT-1's).

One module-scoped set of three tiny runs (rlt1-debug: width 32, 2 + 2 layers, parity, 4 steps)."""
from __future__ import annotations

import shutil

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.export.consolidate import ExportError, consolidate
from rgpt_dist.export.exporter import export
from rgpt_dist.flops import executed_forward_flops, forward_flops, head_flops
from rgpt_dist.registry import build_model
from tests.helpers.dist import torchrun
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


def test_two_ranks_at_zero2_reproduce_one_rank(runs):
    one, two, _, _ = runs
    (got, _), (ref, _) = trajectory(records(two)), trajectory(records(one))
    assert [s for s, *_ in got] == [s for s, *_ in ref] == list(range(1, STEPS + 1))
    for (step, _, loss, norm, lr, _), (_, _, loss_ref, norm_ref, lr_ref, _) in zip(got, ref):
        # measured (2026-12-03): losses within 4e-8 (the mean over micro-batches), norms equal
        assert (loss, norm, lr) == pytest.approx((loss_ref, norm_ref, lr_ref), rel=2e-7), step
    assert ref[-1][2] < ref[0][2]  # it learns
    got_two = consolidate(two)
    a, b = consolidate(one).state_dict, got_two.state_dict
    assert got_two.step == STEPS and set(a) == set(b)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-6, atol=1e-9, msg=name)  # measured: equal


def test_a_resumed_run_equals_the_uninterrupted_one(runs):
    one, _, resumed, out = runs
    assert resumed_line(resumed, 2) in out
    assert trajectory(records(resumed)) == trajectory(records(one))
    a, b = consolidate(one), consolidate(resumed)
    assert a.step == b.step == STEPS
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)


def test_rgpt_export_refuses_and_writes_nothing(runs, tmp_path):
    out = tmp_path / "export"
    with pytest.raises(ExportError, match="model family 'rlt' has no Hugging Face export: no transformers"):
        export(runs[0], out)
    assert list(tmp_path.iterdir()) == []  # neither OUT nor a staging directory


@pytest.mark.parametrize("override, named", [
    ("parallel.tp_size=2", "parallel.tp_size=2: model family 'rlt' does not support tensor parallelism: no tp = 2"),
    ("parallel.compile=model", "parallel.compile=model is not supported by model family 'rlt'"),
    ("parallel.zero_stage=3", "parallel.zero_stage=3 is not supported by model family 'rlt': its merge slices")])
def test_config_validation_refuses_what_rlt_cannot_run(override, named):
    with pytest.raises(ConfigError) as refused:
        load_config(CONFIG, [*ARGS, override])
    assert named in str(refused.value)
    load_config(CONFIG, [*ARGS, "parallel.compile=blocks", "parallel.activation_checkpointing=selective"])


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
