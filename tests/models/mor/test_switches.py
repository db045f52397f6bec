"""Mixture-of-Recursions' switches toward its authors' code (issue #29), each against an fp64
reference written here from the equations (one sequence at a time, the routes chosen by sorting
Python lists; tests/models/reference.py supplies only the plain transformer block):
`update=residual` (x + g core(x) instead of x + g (core(x) - x)), the router z-loss, token choice's
gate at the exit recursion (`router_gate_at=exit`) and the authors' token-choice preset; the
evaluation's second routing and the routers' agreement rate (`routing_comparison`).
Measured 2026-12-03: logits, auxiliary losses, gradients, cached decodes and losses within 2.0e-15 of
the reference, the agreement rate exact; held to 1e-12."""
from __future__ import annotations

import math

import pytest
import torch

from rgpt_dist.config import ConfigError, load_config
from rgpt_dist.models.mor.config import AUTHORS_TOKEN_CHOICE
from tests.models.mor.test_model import batch, ce, make, routes_of
from tests.models.reference import block, layer_norm, prelude


def core(sd, cfg, x):
    """The shared core (n_rec blocks) on the tokens x (k, d), causal among them in their order."""
    o = x[None]
    for j in range(cfg.n_rec):
        o = block(o, sd, f"recurrence.blocks.{j}.", cfg.n_head, cfg.ln_eps)
    return o[0]


def combine(cfg, x, o, g):
    """delta: x + g (o - x); residual (the authors' scatter_add of g o onto x): x + g o. x, o (d,)."""
    return x + g * o if cfg.update == "residual" else x + g * (o - x)


def expert_step(sd, cfg, rows, candidates, i, routing):
    """Recursion i of expert choice on every row: (new rows, chosen positions per row, BCE sum,
    z^2 sum, candidate count)."""
    N, T = cfg.n_loops, rows[0].shape[0]
    w, c = sd["recurrence.router.weight"][i], (N - i) / N
    out, chosen_rows, bce, zsq, count = [], [], 0.0, 0.0, 0
    for x_b, cand in zip(rows, candidates):
        z = x_b @ w                                                            # (T,)
        if routing == "top_k":
            chosen = sorted(sorted(cand, key=lambda t: -float(z[t].detach()))[:math.ceil(c * T)])
        else:
            chosen = list(cand) if c >= 1 else [t for t in cand if float(z[t].detach()) > 0]
        for t in cand:
            p = torch.sigmoid(z[t])
            bce = bce - (torch.log(p) if t in chosen else torch.log(1 - p))
            zsq = zsq + z[t] ** 2
        count += len(cand)
        new = list(x_b)
        if chosen:
            o = core(sd, cfg, x_b[chosen])
            for k, t in enumerate(chosen):
                new[t] = combine(cfg, x_b[t], o[k], cfg.router_alpha * torch.sigmoid(z[t]))
        out.append(torch.stack(new))
        chosen_rows.append(chosen)
    return out, chosen_rows, bce, zsq, count


def token_choice(sd, cfg, h0):
    """Token choice on h^(0) (B, T, d): (final rows, routes, balancing + z-loss). Depth = argmax + 1
    of p = softmax(W h^(0)), g = alpha p(depth); gate `every`: each recursion combines, `exit`:
    ungated o before the last recursion, combine(h^(0), o, g) at it."""
    N, (B, T, _) = cfg.n_loops, h0.shape
    logits = h0 @ sd["recurrence.router.weight"].T                             # (B, T, N)
    p = torch.softmax(logits, dim=-1)
    depth, g = p.argmax(-1) + 1, cfg.router_alpha * p.max(-1).values
    share = [(depth == j + 1).double().mean() for j in range(N)]
    aux = cfg.router_aux_coef * N * sum(share[j] * p[..., j].mean() for j in range(N))
    aux = aux + cfg.router_z_coef * (torch.log(torch.exp(logits).sum(-1)) ** 2).mean()
    rows, routes = [h0[b] for b in range(B)], []
    for i in range(N):
        chosen_rows = []
        for b in range(B):
            chosen = [t for t in range(T) if int(depth[b, t]) > i]
            new = list(rows[b])
            if chosen:
                o = core(sd, cfg, rows[b][chosen])
                for k, t in enumerate(chosen):
                    if cfg.router_gate_at == "every":
                        new[t] = combine(cfg, rows[b][t], o[k], g[b, t])
                    else:
                        new[t] = combine(cfg, h0[b, t], o[k], g[b, t]) if int(depth[b, t]) == i + 1 else o[k]
            rows[b] = torch.stack(new)
            chosen_rows.append(chosen)
        routes.append(chosen_rows)
    return rows, routes, aux


def reference(sd, cfg, idx, routing):
    """(logits (B, T, V_padded), auxiliary loss, routes [recursion][row] -> positions) at depth N.
    routing: top_k | threshold (expert choice) | token."""
    h0 = prelude(sd, cfg, idx)
    if routing == "token":
        rows, routes, aux = token_choice(sd, cfg, h0)
    else:
        rows, aux, routes = [h0[b] for b in range(idx.shape[0])], 0.0, []
        candidates = [list(range(idx.shape[1]))] * idx.shape[0]
        for i in range(cfg.n_loops):
            rows, candidates, bce, zsq, count = expert_step(sd, cfg, rows, candidates, i, routing)
            aux = aux + (cfg.router_aux_coef * bce + cfg.router_z_coef * zsq) / count
            routes.append(candidates)
    h = torch.stack(rows)
    for i in range(cfg.n_coda):
        h = block(h, sd, f"coda.{i}.", cfg.n_head, cfg.ln_eps)
    h = layer_norm(h, sd["head.ln_f.weight"], sd["head.ln_f.bias"], cfg.ln_eps)
    return h @ sd["embed.wte.weight"].T, aux, routes


def check_training(model, cfg, idx, tgt, routing):
    """Routes, logits, auxiliary loss and every gradient of a training forward against the
    reference; returns the largest error seen."""
    routes = routes_of(model)
    out = model.train()(idx, tgt)
    sd = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    logits, aux, ref_routes = reference(sd, cfg, idx, routing)
    assert routes == ref_routes
    errs = [(out.logits - logits).abs().max().item(), abs(out.aux["aux_loss"].item() - aux.item())]
    (out.loss + out.aux["aux_loss"]).backward()
    (ce(logits, tgt, cfg) + aux).backward()
    errs += [(p.grad - sd[name].grad).abs().max().item() for name, p in model.named_parameters()]
    assert max(errs) < 1e-12, errs
    return logits


@pytest.mark.parametrize("z_coef", [0.0, 0.02])
def test_residual_update_and_z_loss_in_training_match_reference(z_coef):
    """Expert choice, top-k routes: x + g core(x) on the kept tokens; the z-loss sum_i mean z_i^2
    over each recursion's candidates joins the BCE."""
    model, cfg = make(update="residual", router_z_coef=z_coef)
    idx, tgt = batch(cfg)
    logits = check_training(model, cfg, idx, tgt, "top_k")
    delta, _ = make()
    with torch.no_grad():
        assert (delta.train()(idx).logits - logits).abs().max() > 1e-3  # the switch changes the model


def test_residual_update_at_inference_matches_reference():
    """Threshold routing (causal, masked) with the residual update, and the cached decode equal to it."""
    model, cfg = make(update="residual")
    idx, _ = batch(cfg, T=24)
    with torch.no_grad():
        got = model.eval()(idx).logits
        logits, _, _ = reference(model.state_dict(), cfg, idx, "threshold")
        assert (got - logits).abs().max() < 1e-12
        cache = model.make_cache()
        chunks = [model(idx[:, a:b], cache=cache).logits for a, b in ((0, 10), (10, 11), (11, 24))]
        assert (torch.cat(chunks, 1) - got).abs().max() < 1e-12


@pytest.mark.parametrize("update,gate_at", [("residual", "exit"), ("delta", "exit"), ("residual", "every")])
def test_token_choice_switches_match_reference(update, gate_at):
    """Token choice at the authors' constants (alpha 1, balancing 0.1, z-loss; at the mild 0.05 here
    so that it is not swamped) with each update form and gate placement."""
    model, cfg = make(routing="token", update=update, router_gate_at=gate_at, router_alpha=1.0,
                      router_aux_coef=0.1, router_z_coef=0.05)
    idx, tgt = batch(cfg, T=24)
    check_training(model, cfg, idx, tgt, "token")
    with torch.no_grad():  # causal: inference routes alike, and the cache reproduces it
        full = model.eval()(idx).logits
        cache = model.make_cache()
        chunks = [model(idx[:, a:b], cache=cache).logits for a, b in ((0, 9), (9, 10), (10, 24))]
    assert (torch.cat(chunks, 1) - full).abs().max() < 1e-12


def test_authors_token_choice_preset_and_validation():
    cfg = load_config("mor-debug", list(AUTHORS_TOKEN_CHOICE)).model
    assert (cfg.routing, cfg.update, cfg.router_alpha, cfg.router_aux_coef, cfg.router_z_coef, cfg.router_gate_at) == \
        ("token", "residual", 1.0, 0.1, 1e-5, "exit")
    default = load_config("mor-debug").model
    assert (default.update, default.router_z_coef, default.router_gate_at) == ("delta", 0.0, "every")
    with pytest.raises(ConfigError, match="update='sum' must be one of"):
        load_config("mor-debug", ["model.update=sum"])
    with pytest.raises(ConfigError, match="router_gate_at='exit' needs routing='token'"):
        load_config("mor-debug", ["model.router_gate_at=exit"])
    with pytest.raises(ConfigError, match="router_z_coef=2.0 must be <= 1"):
        load_config("mor-debug", ["model.router_z_coef=2"])


@pytest.mark.parametrize("main", ["threshold", "top_k"])
def test_eval_metrics_other_routing_loss_and_agreement_by_hand(main):
    """all_exits in eval mode: the other routing's loss (reference logits) and the agreement rate
    counted by hand from the two reference route sets over recursions 1..N-1 and every token."""
    model, cfg = make(inference_routing=main)
    idx, tgt = batch(cfg, T=24)
    other = "top_k" if main == "threshold" else "threshold"
    with torch.no_grad():
        out = model.eval()(idx, tgt, all_exits=True)
        sd = model.state_dict()
        ref_main, ref_other = reference(sd, cfg, idx, main), reference(sd, cfg, idx, other)
    B, T, N = 2, 24, cfg.n_loops
    same = sum((t in ref_main[2][i][b]) == (t in ref_other[2][i][b]) for i in range(1, N) for b in range(B)
               for t in range(T))
    metrics = out.aux["eval_metrics"]
    assert set(metrics) == {f"val_loss_{other.replace('_', '')}", "router_agreement"}
    assert 0.2 < same / (B * T * (N - 1)) < 0.95  # the routings do disagree, on some decisions only
    assert abs(metrics["router_agreement"].item() - same / (B * T * (N - 1))) < 1e-12
    assert abs(metrics[f"val_loss_{other.replace('_', '')}"].item() - ce(ref_other[0], tgt, cfg).item()) < 1e-12
    assert abs(out.loss.item() - ce(ref_main[0], tgt, cfg).item()) < 1e-12
    with torch.no_grad():  # only the trainer's evaluation pays for it; token choice has one routing
        assert "eval_metrics" not in model(idx, tgt).aux
        assert "eval_metrics" not in make(routing="token")[0].eval()(idx, tgt, all_exits=True).aux
