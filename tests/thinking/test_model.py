"""The silent-thinking model (rgpt_dist.thinking.model) against the fp64 reference of
tests/thinking/reference.py, written from SPEC section 8's equations with the model's weights read as
plain tensors (attention, LayerNorm, GELU/ReLU, rotary positions and the gate by hand). Tiny sizes:
the file runs in seconds.
Measured fp64 error against the reference: about 1e-14 (tolerance 1e-12; the issue asks <= 1e-10)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from rgpt_dist.depth import step_depths
from rgpt_dist.thinking.config import (BASELINE_LAYERS, FLAVOURS, ThinkingModelConfig, config_for,
                                       steps_sampler)
from rgpt_dist.thinking.inputs import ThinkingInputs
from rgpt_dist.thinking.model import FixedDepthModel, ThinkingModel, build, thinking_loss
from tests.thinking.reference import ref_bce, ref_forward, ref_gelu, ref_layer_norm, ref_residual, ref_step

B, T, V = 3, 6, 11
TINY = dict(vocab_size=V, d_model=16, n_head=4, d_ff=24, max_steps=6, train_steps_min=1, train_steps_max=4,
            dropout=0.1)


# -- inputs ---------------------------------------------------------------------------------------
CHAIN = [(0, 1), (1, 2), (2, 3), (4, 0)]
"""Edges u -> v of the test graph: 0 -> 1 -> 2 -> 3 and 4 -> 0; position 5 is isolated."""


def graph_mask(edges=CHAIN, n=T):
    """[T, T] bool: query v sees key u for each edge u -> v, and itself."""
    m = torch.eye(n, dtype=torch.bool)
    for u, v in edges:
        m[v, u] = True
    return m


def make_inputs(cfg: ThinkingModelConfig, seed=0, adjacency=False) -> ThinkingInputs:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, V, (B, T), generator=g)
    tokens[1, 4:] = 0  # padding at the end of example 1
    K = cfg.readout_k
    readout = torch.stack([torch.randperm(4, generator=g)[:K] for _ in range(B)])
    roles = None
    if cfg.n_roles:
        roles = torch.zeros(B, T, dtype=torch.long)
        for b in range(B):
            for j in range(K):
                roles[b, readout[b, j]] = 1 + j % cfg.n_roles
    mask = graph_mask().expand(B, T, T).clone() if adjacency else None
    return ThinkingInputs(tokens=tokens, labels=torch.tensor([0, 1, 1]), difficulty=torch.ones(B, dtype=torch.long),
                          readout=readout, roles=roles, attn_mask=mask)


def ref_mask(x: ThinkingInputs) -> torch.Tensor:
    """[B, T, T]: the input's mask, else every non-padding key (and the query itself)."""
    if x.attn_mask is not None:
        return x.attn_mask
    return (x.tokens != 0)[:, None, :] | torch.eye(x.tokens.shape[1], dtype=torch.bool)


def randomised(cfg: ThinkingModelConfig, seed=0) -> ThinkingModel:
    """An fp64 model in eval mode with every parameter redrawn (so LayerScale gains, the gate's bias and
    the LayerNorms' affine parts all matter)."""
    torch.manual_seed(seed)
    model = ThinkingModel(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model


CASES = {
    "graph-no-layerscale": dict(n_roles=2, readout_k=2, activation="relu", positions="none", layerscale=None),
    "graph-layerscale": dict(n_roles=2, readout_k=2, activation="relu", positions="none", layerscale=1e-4),
    "rope-layerscale-padding": dict(n_roles=0, readout_k=1, activation="gelu", positions="rope", layerscale=1e-4),
    "rope-adjacency": dict(n_roles=0, readout_k=1, activation="gelu", positions="rope", layerscale=0.0),
}


@pytest.mark.parametrize("case", CASES)
def test_step_and_forward_match_reference(case):
    fields = CASES[case]
    cfg = ThinkingModelConfig(**TINY, **fields)
    model = randomised(cfg)
    x = make_inputs(cfg, adjacency=case.endswith("adjacency") or case.startswith("graph"))
    assert (model.core.residual.gamma1 is None) == (not fields["layerscale"])
    W = {k: v.detach() for k, v in model.state_dict().items()}
    mask = ref_mask(x)
    h = torch.randn(B, T, cfg.d_model, dtype=torch.float64)
    with torch.no_grad():
        for t in (0, 3):
            got = model.core(h, t, model.attention_mask(x))
            want = ref_step(h, t, {k.removeprefix("core."): v for k, v in W.items() if k.startswith("core.")},
                            mask, cfg)
            assert (got - want).abs().max().item() <= 1e-12
            assert (got - h).abs().max().item() > 1e-2  # the step does move h
        got = model(x, 4, all_steps=True)
    want = ref_forward(x, 4, W, cfg, mask)
    assert got.shape == (4, B)
    assert (got - want).abs().max().item() <= 1e-12


def test_layerscale_initialised_per_channel():
    cfg = ThinkingModelConfig(**TINY, layerscale=1e-4)
    res = ThinkingModel(cfg).core.residual
    for g in (res.gamma1, res.gamma2):
        assert g.shape == (cfg.d_model,) and torch.all(g == 1e-4) and g.requires_grad
    assert ThinkingModel(ThinkingModelConfig(**TINY, layerscale=None)).core.residual.gamma1 is None
    names = {n for n, _ in ThinkingModel(ThinkingModelConfig(**TINY, layerscale=0.0)).named_parameters()}
    assert not any("gamma" in n for n in names)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_thinking_loss_matches_reference(alpha):
    g = torch.Generator().manual_seed(1)
    S, n = 4, 5
    logits = torch.randn(S, n, generator=g, dtype=torch.float64) * 2
    labels = torch.tensor([0, 1, 1, 0, 1])
    y = labels.double()
    want = (1 - alpha) * ref_bce(logits[-1], y) + alpha * sum(ref_bce(logits[s], y) for s in range(S)) / S
    got = thinking_loss(logits, labels, alpha)
    assert abs(got.item() - want.item()) <= 1e-12
    if alpha == 0:  # the final step's logits alone suffice
        assert abs(thinking_loss(logits[-1], labels, 0.0).item() - want.item()) <= 1e-12
    else:
        with pytest.raises(ValueError, match="every step"):
            thinking_loss(logits[-1], labels, alpha)


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan"), True])
def test_thinking_loss_refuses_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        thinking_loss(torch.zeros(2, 3), torch.zeros(3), alpha)


def test_final_only_loss_runs_one_readout():
    cfg = ThinkingModelConfig(**TINY, n_roles=0, readout_k=1)
    model = randomised(cfg)
    x = make_inputs(cfg)
    calls = []
    model.head.register_forward_hook(lambda *_: calls.append(1))
    loss0, final0 = model.loss(x, 4, alpha=0.0)
    assert len(calls) == 1
    calls.clear()
    loss_mixed, final_mixed = model.loss(x, 4, alpha=0.3)
    assert len(calls) == 4
    assert torch.equal(final0, final_mixed)
    with torch.no_grad():
        step_logits = model(x, 4, all_steps=True)
    want = 0.7 * ref_bce(step_logits[-1], x.labels.double()) + 0.3 * sum(
        ref_bce(step_logits[s], x.labels.double()) for s in range(4)) / 4
    assert abs(loss_mixed.item() - want.item()) <= 1e-12
    assert abs(loss0.item() - ref_bce(step_logits[-1], x.labels.double()).item()) <= 1e-12


@pytest.mark.parametrize("bias", [-2.0, -3.0])
def test_gate_bias_init(bias):
    cfg = ThinkingModelConfig(**TINY, gate_bias=bias)
    block = ThinkingModel(cfg).double().core
    assert torch.all(block.gate_proj.bias == bias)
    with torch.no_grad():
        block.gate_proj.weight.zero_()
        z = block.gate(torch.randn(B, T, cfg.d_model, dtype=torch.float64),
                       torch.randn(B, T, cfg.d_model, dtype=torch.float64))
    assert torch.allclose(z, torch.full_like(z, 1 / (1 + math.exp(-bias))), rtol=0, atol=1e-15)
    if bias == -2.0:
        assert abs(z[0, 0, 0].item() - 0.11920292202211755) < 1e-15  # SPEC: about 0.12 at init


def test_adjacency_mask_limits_one_step_to_in_neighbours():
    cfg = ThinkingModelConfig(**TINY, n_roles=2, readout_k=2)
    model = randomised(cfg)
    x = make_inputs(cfg, adjacency=True)

    def states(tokens, steps):
        y = ThinkingInputs(**{**x.__dict__, "tokens": tokens})
        with torch.no_grad():
            h, mask = model.embed(y), model.attention_mask(y)
            for t in range(steps):
                h = model.core(h, t, mask)
        return h

    base = states(x.tokens, 1)
    node = 2  # in-neighbours: 1 (edge 1 -> 2) and itself
    for other in range(T):
        changed = x.tokens.clone()
        changed[:, other] = changed[:, other] % (V - 1) + 1  # another non-padding id
        moved = (states(changed, 1)[:, node] - base[:, node]).abs().max().item()
        if other in (node, 1):
            assert moved > 1e-3, other
        else:
            assert moved == 0.0, other
    # two steps reach the 2-hop predecessor 0, still not 3, 4 (three hops away via 0) or 5
    changed = x.tokens.clone()
    changed[:, 0] = changed[:, 0] % (V - 1) + 1
    assert (states(changed, 2)[:, node] - states(x.tokens, 2)[:, node]).abs().max().item() > 1e-3
    for other in (3, 4, 5):
        changed = x.tokens.clone()
        changed[:, other] = changed[:, other] % (V - 1) + 1
        assert torch.equal(states(changed, 2)[:, node], states(x.tokens, 2)[:, node])


def test_padding_keys_are_invisible():
    cfg = ThinkingModelConfig(**TINY, n_roles=0, readout_k=1, positions="rope", activation="gelu")
    model = randomised(cfg)
    x = make_inputs(cfg)  # example 1 is padded from position 4
    longer = ThinkingInputs(**{**x.__dict__, "tokens": torch.cat([x.tokens, torch.zeros(B, 3, dtype=torch.long)], 1)})
    with torch.no_grad():
        assert torch.allclose(model(x, 3), model(longer, 3), rtol=0, atol=1e-12)


def test_per_step_logits_equal_shorter_runs():
    cfg = ThinkingModelConfig(**TINY, n_roles=2, readout_k=2, layerscale=1e-4)
    model = randomised(cfg)
    x = make_inputs(cfg, adjacency=True)
    with torch.no_grad():
        every = model(x, cfg.max_steps, all_steps=True)
        assert every.shape == (cfg.max_steps, B)
        for s in range(1, cfg.max_steps + 1):
            assert torch.equal(every[s - 1], model(x, s))
        assert torch.equal(every[1], model(x, np.int64(2)))  # an evaluator's numpy step count
    assert not torch.equal(every[0], every[-1])


@pytest.mark.parametrize("steps", [0, -1, 7, 100, True, 2.0])
def test_steps_out_of_range(steps):
    cfg = ThinkingModelConfig(**TINY)
    model = ThinkingModel(cfg)
    with pytest.raises(ValueError, match=r"steps=.*max_steps=6"):
        model(make_inputs(cfg), steps)


def test_bad_inputs_named():
    cfg = ThinkingModelConfig(**TINY, n_roles=2, readout_k=2)
    model = ThinkingModel(cfg)
    x = make_inputs(cfg, adjacency=True)
    bad = {
        "tokens ids must be in": {"tokens": x.tokens + V},
        "readout has shape": {"readout": x.readout[:, :1]},
        "readout ids must be in": {"readout": x.readout + T},
        "roles missing": {"roles": None},
        "attn_mask must be": {"attn_mask": x.attn_mask[:, :-1]},
        "no key": {"attn_mask": torch.zeros_like(x.attn_mask)},
    }
    for message, change in bad.items():
        with pytest.raises(ValueError, match=message):
            model(ThinkingInputs(**{**x.__dict__, **change}), 2)


def test_config_problems_name_values():
    good = ThinkingModelConfig(**TINY)
    assert good.problems() == []
    bad = ThinkingModelConfig(vocab_size=0, d_model=18, n_head=4, d_ff=8, dropout=1.0, positions="rope",
                              activation="tanh", layerscale=-1.0, gate_bias=float("nan"), max_steps=4,
                              train_steps_min=2, train_steps_max=5, supervision_alpha=2.0)
    text = "\n".join(bad.problems())
    for needle in ("model.vocab_size=0", "model.d_model=18 is not divisible by model.n_head=4", "model.dropout=1.0",
                   "model.activation='tanh'", "model.layerscale=-1.0", "model.gate_bias=nan must be finite",
                   "model.train_steps_max=5", "model.supervision_alpha=2.0"):
        assert needle in text, needle
    odd = ThinkingModelConfig(**{**TINY, "d_model": 12, "n_head": 4}, positions="rope")  # head_dim 3
    assert any("head_dim" in p for p in odd.problems())
    with pytest.raises(ValueError, match="model.vocab_size=0"):
        ThinkingModel(bad)


def test_flavours_and_config_for():
    for name in FLAVOURS:
        assert config_for(name, vocab_size=V).problems() == []
    graph, logic, rel = (config_for(n, vocab_size=V) for n in ("graph", "logic", "relational"))
    assert (graph.d_model, graph.n_head, graph.d_ff, graph.gains, graph.positions) == (128, 4, 256, None, "none")
    assert (graph.train_steps_min, graph.train_steps_max, graph.max_steps) == (5, 8, 20)
    assert (logic.d_model, logic.n_head, logic.d_ff, logic.gains, logic.positions) == (256, 8, 1024, 1e-4, "rope")
    assert (logic.train_steps_min, logic.train_steps_max, logic.max_steps) == (4, 16, 28)
    assert (rel.train_steps_min, rel.train_steps_max, rel.max_steps, rel.positions) == (1, 12, 20, "rope")
    assert config_for("graph-debug", vocab_size=V).d_model == 64

    class Task:
        vocab_size, readout_k, positions = 27, 2, "none"
    assert (config_for("graph", Task()).vocab_size, config_for("graph", Task()).readout_k) == (27, 2)
    with pytest.raises(ValueError, match="positions='none' differs from flavour 'logic'"):
        config_for("logic", Task())
    with pytest.raises(ValueError, match="unknown thinking flavour 'graf'"):
        config_for("graf")
    with pytest.raises(ValueError, match="d_modle is not a field"):
        config_for("graph", d_modle=3)


def test_steps_sampler_deterministic_in_range():
    cfg = config_for("logic", vocab_size=V)
    a, b = steps_sampler(cfg), steps_sampler(cfg)
    draws = [a(7, step) for step in range(400)]
    assert draws == [b(7, step) for step in range(400)]            # a pure function of (seed, step)
    assert set(draws) == set(range(4, 17))                          # U[4, 16]: every value, nothing else
    assert draws != [a(8, step) for step in range(400)]             # the seed matters
    assert step_depths(a, 7, 3, micro_batches=4) == [draws[3]] * 4  # one draw per optimizer step
    per_micro = steps_sampler(cfg, per_micro_batch=True)
    assert step_depths(per_micro, 7, 3, 4) == [per_micro(7, 3, m) for m in range(4)]
    with pytest.raises(ValueError, match="max_steps=6"):
        steps_sampler(ThinkingModelConfig(**{**TINY, "train_steps_max": 9}))


def block_params(d, f):
    """One pre-norm block: qkv and output projections, two LayerNorms, the FFN (all with biases)."""
    return (3 * d * d + 3 * d) + (d * d + d) + 4 * d + (d * f + f) + (f * d + d)


def expected_params(cfg: ThinkingModelConfig, layers: int | None) -> int:
    d, K = cfg.d_model, cfg.readout_k
    shared = cfg.vocab_size * d + cfg.n_roles * d + 2 * d                            # embeddings, LN
    shared += 2 * K * d + (K * d * d + d) + (d + 1)                                   # the head
    if layers is not None:
        return shared + layers * block_params(d, cfg.d_ff)
    gains = 2 * d if cfg.gains else 0
    return shared + block_params(d, cfg.d_ff) + gains + (2 * d * d + d) + cfg.max_steps * d


def test_parameter_counts_and_baseline_ratio():
    """The baselines' L distinct blocks give the authors' 4-6.4x (SPEC section 8) at their vocabularies
    (graph 27: A-Z and PAD; logic 9; family 54)."""
    ratios, counts = {}, {}
    for name, vocab in (("graph", 27), ("logic", 9), ("relational", 54), ("graph-debug", 27)):
        cfg = config_for(name, vocab_size=vocab)
        ours, base = build(cfg), build(cfg, BASELINE_LAYERS[name])
        assert isinstance(base, FixedDepthModel) and not base.recurrent and ours.recurrent
        n_ours = sum(p.numel() for p in ours.parameters())
        n_base = sum(p.numel() for p in base.parameters())
        if name != "graph-debug":
            counts[name] = n_base
        assert n_ours == expected_params(cfg, None), name
        assert n_base == expected_params(cfg, BASELINE_LAYERS[name]), name
        ratios[name] = n_base / n_ours
    # the authors' own counts (graph/baseline_results.json "Graph Transformer", nested-expr/ and
    # family-reason/baseline_results.json "Fixed-Depth Transformer")
    assert counts == {"graph": 832_385, "logic": 6_387_457, "relational": 4_029_697}
    assert 6.35 < ratios["logic"] < 6.45 and 3.95 < ratios["relational"] < 4.05
    assert not any("gate" in n or "depth" in n for n, _ in build(config_for("logic", vocab_size=9), 8).named_parameters())


def test_baseline_runs_its_blocks_once():
    cfg = ThinkingModelConfig(**TINY, n_roles=2, readout_k=2)
    torch.manual_seed(0)
    base = FixedDepthModel(cfg, 3).double().eval()
    x = make_inputs(cfg, adjacency=True)
    W = {k: v.detach() for k, v in base.state_dict().items()}
    with torch.no_grad():
        got = base(x)
        assert torch.equal(got, base(x, steps=5)) and base(x, all_steps=True).shape == (1, B)
    roles = torch.cat([torch.zeros(1, cfg.d_model, dtype=torch.float64), W["role_emb.weight"]])[x.roles]
    h = ref_layer_norm(W["tok_emb.weight"][x.tokens] + roles, W["emb_norm.weight"],
                       W["emb_norm.bias"], cfg.ln_eps)
    for i in range(3):
        h = ref_residual(h, {k.removeprefix(f"core.{i}."): v for k, v in W.items() if k.startswith(f"core.{i}.")},
                         x.attn_mask, cfg)
    feats = torch.cat([h[torch.arange(B), x.readout[:, j]] for j in range(2)], -1)
    u = ref_gelu(ref_layer_norm(feats, W["head.0.weight"], W["head.0.bias"], cfg.ln_eps) @ W["head.1.weight"].T
                 + W["head.1.bias"])
    want = (u @ W["head.4.weight"].T + W["head.4.bias"])[:, 0]
    assert (got - want).abs().max().item() <= 1e-12
    with pytest.raises(ValueError, match="n_layers=0"):
        FixedDepthModel(cfg, 0)


def test_config_loads_like_a_section_and_documents_every_field():
    from rgpt_dist.sections import field_docs, from_dict
    cfg = from_dict(ThinkingModelConfig, {**FLAVOURS["logic"], "vocab_size": 9, "layerscale": "1e-4"})
    assert cfg.layerscale == 1e-4 and cfg.positions == "rope" and cfg.problems() == []
    docs = field_docs(ThinkingModelConfig)
    assert set(docs) == {f.name for f in dataclasses.fields(ThinkingModelConfig)}
    assert "must be 'thinking'" in "\n".join(ThinkingModelConfig(**TINY, family="gpt2").problems())

    class Sharded:
        tp_size = 2
    with pytest.raises(ValueError, match="tp_size=2 must be 1"):
        ThinkingModel(ThinkingModelConfig(**TINY), Sharded())


@pytest.mark.parametrize("task,flavour", [("graph", "graph-debug"), ("logic", "logic"), ("relational", "relational")])
def test_runs_on_each_task_batch(task, flavour):
    """A task's batch (rgpt_dist.thinking.tasks) goes through a narrowed flavour; depth rows past the
    steps run get no gradient (the authors' note: rows >= the training maximum are never trained)."""
    from rgpt_dist.thinking.inputs import make_batch
    from rgpt_dist.thinking.tasks import get_task
    t = get_task(task)
    cfg = config_for(flavour, t, d_model=16, n_head=2, d_ff=16)
    x = make_batch(t, "train", list(range(4)))
    torch.manual_seed(0)
    model = build(cfg)
    loss, final = model.loss(x, 3, alpha=0.5)
    assert final.shape == (4,) and torch.isfinite(loss)
    loss.backward()
    grad = model.core.depth_emb.weight.grad
    assert torch.all(grad[:3].abs().sum(-1) > 0) and torch.all(grad[3:] == 0)
