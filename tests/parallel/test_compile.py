"""parallel.compile on one process, every family: regional compilation (`blocks`) trains exactly like
eager with the depth changing every step, breaks no graph and compiles nothing after the first
variants; with inductor's generated kernels (the GPU path's compiler) 20 AdamW steps with noise
and sampled depths stay within 3e-7 (relative) of eager. On 2 ranks (ZeRO-2, noise on) a compiled
run equals the eager run of the same layout bitwise; the other distributed layouts (ZeRO-3, tp = 2)
are tests/train/test_distributed.py's compiled cases."""
from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from rgpt_dist import noise
from rgpt_dist.config import load_config
from rgpt_dist.models.spec import families, spec_for
from rgpt_dist.noise import NoiseKey
from rgpt_dist.parallel.checkpointing import apply_activation_checkpointing
from rgpt_dist.parallel.compile import apply_compile, compile_stats, compile_units
from rgpt_dist.registry import build_model
from rgpt_dist.models.layers import Block, LMHead
from tests.helpers.tolerance import fp32_bound, max_abs

SMALL = ["model.vocab_size=512", "model.block_size=32", "model.pad_vocab_multiple=64", "train.seq_len=32"]
# more Blocks than dynamo's recompile limit (8): one graph must serve them all
DEEP = {"gpt2": ["model.n_layer=10"], "rlt": ["model.n_enc=10"]}  # RLT: its encoder Blocks compile
DEEP_LOOPED = ["model.n_pre=5", "model.n_coda=5"]


def make(family: str, *extra: str):
    name = next(n for n in spec_for(family).flavours if n.endswith("-debug"))
    cfg = load_config(name, [*SMALL, *extra]).model
    return cfg, build_model(cfg, seed=0).train()


def depths(cfg) -> list[int | None]:
    """Depths 1, R, 2, R + 1, then the same again (None: dense)."""
    spec = spec_for(cfg)
    if not spec.recurrent:
        return [None] * 4
    R = spec.default_depth(cfg)
    return [1, R, 2, R + 1] * 2


# aot_eager runs eager's kernels: measured (2026-12-03, this host) the losses of every family and the
# gradients of gpt2, recurrent_gpt, poisson and relaxed bitwise equal to eager; MoR's and Ouro's
# gradients differ by at most 9e-8 absolute (AOT autograd sums their shared core's per-step
# contributions in another order). Compiled and eager are two float32 paths of one computation, held
# to tests/helpers/tolerance.py's bound: 4x eager's distance from its float64 twin (the same model in
# double, the same noise: drawn in float32, then cast) plus 4 ulps of the value, on the host at hand.
# A wrong gradient (a missed recurrence step, noise drawn twice) moves it by orders more.


def assert_fp32_close(got, ref32, ref64, what) -> None:
    """got and ref32 (tensors or floats), float32 paths of the computation ref64 ran in float64."""
    got, ref32, ref64 = (torch.as_tensor(t) for t in (got, ref32, ref64))
    bound = fp32_bound(max_abs(ref32, ref64), ref64.abs().max().item())
    assert max_abs(got, ref32) <= bound, (what, max_abs(got, ref32), bound)


def assert_step_close(compiled, eager, twin, what) -> None:
    """(loss, grads) of a compiled step against eager's, within the bound eager's float64 twin gives."""
    (loss_c, grads_c), (loss_e, grads_e), (loss_64, grads_64) = compiled, eager, twin
    assert_fp32_close(loss_c, loss_e, loss_64, ("loss", what))
    for k, (gc, ge, g64) in enumerate(zip(grads_c, grads_e, grads_64)):
        assert (ge is None) == (gc is None) == (g64 is None)
        if ge is not None:
            assert_fp32_close(gc, ge, g64, ("grad", k, what))


def step(model, x, y, r, i):
    out = model(x, y, r=r, noise_key=NoiseKey(seed=3, step=i))
    loss = out.loss + out.aux.get("aux_loss", 0.0)
    loss.backward()
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]  # RRT: unused adapters
    model.zero_grad(set_to_none=True)
    return out.loss.detach(), grads


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """No compiled state leaks into other tests (`blocks` also compiles the noise draw, globally)."""
    torch._dynamo.reset()
    counters.clear()
    yield
    noise._compiled_draw = None
    torch._dynamo.reset()


@pytest.mark.parametrize("family", sorted(f for f, spec in families().items() if "compile_blocks" not in spec.refusals))
def test_blocks_compile_trains_like_eager_without_breaks_or_recompiles(family):
    """aot_eager: dynamo's capture and AOT autograd's forward/backward graphs, run by eager kernels,
    so compiled equals eager to float rounding. Every Block (here more than dynamo's recompile limit)
    and the head compile; r sweeps 1, R, 2, R + 1 twice (RRT refuses depths beyond R: up to R there)."""
    cfg, eager = make(family, *DEEP.get(family, DEEP_LOOPED))
    compiled = copy.deepcopy(eager)
    units = apply_compile(compiled, "blocks", backend="aot_eager")
    assert len(units) == len(compile_units(eager)) >= 11  # >= 10 blocks and the head
    assert all(isinstance(u, (Block, LMHead)) for u in units)
    spec = spec_for(cfg)
    rs = depths(cfg)
    if spec.recurrent and spec.max_eval_depth(cfg) == spec.default_depth(cfg):  # fixed-depth family
        rs = [r for r in rs if r <= spec.default_depth(cfg)]
    x, y = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    twin = copy.deepcopy(eager).double()
    frames_after = []
    for i, r in enumerate(rs):
        assert_step_close(step(compiled, x, y, r, i), step(eager, x, y, r, i), step(twin, x, y, r, i), (r, i))
        frames_after.append(compile_stats()["compiled_frames"])
    assert compile_stats()["graph_breaks"] == 0
    # Block, head, the noise draw (+ Poisson's no-grad Block variants)
    assert 2 <= frames_after[-1] <= 5, frames_after
    half = len(rs) // 2
    assert frames_after[half - 1] == frames_after[-1], f"recompiled on the second sweep: {frames_after}"


@pytest.mark.parametrize("family", sorted(f for f, spec in families().items() if "compile_blocks" in spec.refusals))
def test_a_family_declaring_partial_block_compilation_compiles_its_head_and_trains_like_eager(family):
    """A family whose layers are not Blocks (its `refusals['compile_blocks']` says why) compiles the
    head alone under `blocks`, and the step still equals eager's."""
    cfg, eager = make(family)
    compiled = copy.deepcopy(eager)
    units = apply_compile(compiled, "blocks", backend="aot_eager")
    assert len(units) == 1 and isinstance(units[0], LMHead)
    x, y = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    twin = copy.deepcopy(eager).double()
    assert_step_close(step(compiled, x, y, None, 0), step(eager, x, y, None, 0), step(twin, x, y, None, 0), family)


def test_compile_is_applied_before_activation_checkpointing_and_both_wrap():
    """The trainer's order (rgpt_dist.train.run): compile, then checkpointing wraps its units; a
    compiled forward has `__wrapped__` too, which must not make checkpointing skip a unit."""
    cfg, model = make("gpt2")  # a dense model's checkpoint units are its (compiled) Blocks
    reference = copy.deepcopy(model)
    apply_compile(model, "blocks", backend="aot_eager")
    units = apply_activation_checkpointing(model, "recurrence")
    assert units and all(getattr(u.forward, "checkpointed", False) for u in units)
    x, y = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    twin = copy.deepcopy(reference).double()
    assert_step_close(step(model, x, y, None, 0), step(reference, x, y, None, 0), step(twin, x, y, None, 0),
                      "checkpointed")  # measured: bitwise equal
    assert compile_stats()["graph_breaks"] == 0


def test_unknown_mode_is_refused():
    _, model = make("recurrent_gpt")
    with pytest.raises(ValueError, match="parallel.compile='everything'"):
        apply_compile(model, "everything")


@pytest.mark.slow
def test_inductor_twenty_steps_with_noise_and_sampled_depth_match_eager():
    """Inductor's generated C++ kernels (the compiler GPU runs use, here on CPU): 20 AdamW steps of
    RecurrentGPT with its noise on and r ~ U{1..R} redrawn every step; each step's loss within the bound
    eager's float64 twin (its own AdamW in double) gives (measured 2026-12-03: at most 7.7e-8 relative,
    one fp32 ulp, in 11 of the 20 steps; bitwise in the others)."""
    cfg, eager = make("recurrent_gpt")
    assert cfg.sigma_x > 0 and cfg.sigma_g > 0
    compiled, twin = copy.deepcopy(eager), copy.deepcopy(eager).double()
    apply_compile(compiled, "blocks", backend="inductor")
    sampler = spec_for(cfg).depth_sampler(cfg)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, compiled, twin)]
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for i in range(20):
        x, y = (torch.randint(0, 512, (2, 32), generator=gen) for _ in range(2))
        r = sampler(0, i)
        seen.add(r)
        losses = []
        for model, opt in zip((eager, compiled, twin), opts):
            out = model(x, y, r=r, noise_key=NoiseKey(seed=0, step=i))
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(out.loss.item())
        assert_fp32_close(losses[1], losses[0], losses[2], (i, r))
    assert len(seen) > 1
    assert compile_stats()["graph_breaks"] == 0


def test_blocks_mode_draws_the_same_noise_through_one_graph_for_every_shape():
    """`blocks` leaves the noise outside the compiled Blocks and routes its draws through one
    compiled kernel (noise.compile_draws): the same values as the eager draw, one graph for every
    key and shape."""
    key = NoiseKey(seed=7, step=3, micro_batch=1, dp_rank=1)
    shapes = [(2, 32, 64), (2, 32, 16), (5,), (3, 7)]
    eager = [key.at(i).normal(stream, shape, 0.1, "cpu", torch.float32)
             for i, (stream, shape) in enumerate(zip(["x", "g", "x", "state"], shapes))]
    _, model = make("recurrent_gpt")
    apply_compile(model, "blocks", backend="aot_eager")
    drawn = [key.at(i).normal(stream, shape, 0.1, "cpu", torch.float32)
             for i, (stream, shape) in enumerate(zip(["x", "g", "x", "state"], shapes))]
    for a, b in zip(drawn, eager):
        assert torch.equal(a, b)
    assert compile_stats() == {"compiled_frames": 1, "graph_breaks": 0}


@pytest.mark.slow
def test_two_ranks_compiled_train_like_two_ranks_eager(dataset, tmp_path):
    """The distributed compiled path (`blocks`, aot_eager) against eager of the SAME layout: 2 ranks,
    ZeRO-2 (the case tests/train/test_distributed.py compares only with the 1-rank reference, at 2e-5),
    with the noise on (a comparison across layouts must turn it off: its key holds the dp rank) and r
    changing every step. Per-step depth, loss, gradient norm and lr, the validation loss and early-exit
    curve, and the consolidated weights after 4 AdamW steps: measured (2026-12-03) bitwise equal, as
    aot_eager runs eager's kernels on the same ranks in the same order, so they must stay equal."""
    from rgpt_dist.checkpoints.consolidate import consolidate
    from rgpt_dist.registry import build_model
    from tests.helpers.runs import records, train, trajectory

    args = ["parallel.zero_stage=2", "train.max_steps=4", "eval.every_steps=4", "eval.batches=2",
            "checkpoint.every_steps=4"]
    train(2, tmp_path / "eager", dataset, *args)
    compiled = train(2, tmp_path / "compiled", dataset, *args, "parallel.compile=blocks",
                     "parallel.compile_backend=aot_eager")
    (steps_e, evals_e), (steps_c, evals_c) = (trajectory(records(tmp_path / d)) for d in ("eager", "compiled"))
    assert [s[0] for s in steps_c] == [1, 2, 3, 4] and len({s[1] for s in steps_c}) > 1  # r changed
    assert steps_c == steps_e and evals_c == evals_e and evals_e[0][2], (steps_c, steps_e, evals_c, evals_e)
    stats = [(r["compiled_frames"], r["graph_breaks"]) for r in compiled if "loss" in r]
    assert stats[0][0] > 0 and set(stats) == {stats[0]} and stats[0][1] == 0, stats  # compiled once, no break
    eager_w, compiled_w = (consolidate(tmp_path / d) for d in ("eager", "compiled"))
    assert compiled_w.step == eager_w.step == 4
    init = build_model(eager_w.config.model, seed=eager_w.config.train.seed).state_dict()
    moved = sum(not torch.equal(v, init[k]) for k, v in eager_w.state_dict.items())
    assert moved > len(init) // 2, "training did not move the weights: the comparison would be vacuous"
    assert all(torch.equal(compiled_w.state_dict[k], v) for k, v in eager_w.state_dict.items())
