"""An independent, deliberately naive implementation of the paper's equations, reading weights
from a model's state dict: explicit LayerNorm, tanh-GELU, masked softmax attention, the gated
recurrence written out. It shares no code with rgpt_dist.models."""
from __future__ import annotations

import math

import torch


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(x, sd, p, n_head):
    """x (B, T, d). qkv output features are grouped per head as [q_h, k_h, v_h]."""
    B, T, d = x.shape
    hd = d // n_head
    qkv = x @ sd[p + "qkv.weight"].T + sd[p + "qkv.bias"]
    heads = []
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for h in range(n_head):
        base = h * 3 * hd
        q, k, v = (qkv[..., base + j * hd: base + (j + 1) * hd] for j in range(3))
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        scores = scores.masked_fill(mask, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    y = torch.cat(heads, dim=-1)
    return y @ sd[p + "proj.weight"].T + sd[p + "proj.bias"]


def block(x, sd, p, n_head, eps):
    x = x + attention(layer_norm(x, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], eps), sd, p + "attn.", n_head)
    m = layer_norm(x, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], eps)
    m = gelu_tanh(m @ sd[p + "mlp.fc.weight"].T + sd[p + "mlp.fc.bias"])
    return x + m @ sd[p + "mlp.proj.weight"].T + sd[p + "mlp.proj.bias"]


def prelude(sd, cfg, idx):
    """Token + position embeddings of idx (B, T), then the prelude blocks: (B, T, d)."""
    h = sd["embed.wte.weight"][idx] + sd["embed.wpe.weight"][:idx.shape[1]]
    for i in range(cfg.n_pre):
        h = block(h, sd, f"prelude.{i}.", cfg.n_head, cfg.ln_eps)
    return h


def recurrent_gpt_logits(sd, cfg, idx, r, noise=None):
    """SPEC section 1. noise: list of (eps_x, eps_g) per step, or None for no noise."""
    eps = cfg.ln_eps
    h = prelude(sd, cfg, idx)
    h_pre = h
    for step in range(r):
        eps_x, eps_g = noise[step] if noise is not None else (0.0, 0.0)
        w_proj = torch.cat([sd["recurrence.proj_h.weight"], sd["recurrence.proj_pre.weight"]], dim=1)  # (d, 2d)
        h_tilde = torch.cat([h + eps_x, h_pre], dim=-1) @ w_proj.T
        o = h_tilde
        for i in range(cfg.n_rec):
            o = block(o, sd, f"recurrence.blocks.{i}.", cfg.n_head, eps)
        z = torch.cat([layer_norm(h, sd["recurrence.ln_h.weight"], sd["recurrence.ln_h.bias"], eps),
                       layer_norm(h_pre, sd["recurrence.ln_pre.weight"], sd["recurrence.ln_pre.bias"], eps)], -1)
        w_fc = torch.cat([sd["recurrence.gate_h.weight"], sd["recurrence.gate_pre.weight"]], dim=1)  # (d, 2d)
        a = z @ w_fc.T + sd["recurrence.gate_h.bias"]
        a = a * torch.sigmoid(a)  # SiLU
        f = a @ sd["recurrence.gate_out.weight"].T + sd["recurrence.gate_out.bias"]
        g = torch.sigmoid(f / cfg.tau + eps_g)
        h = g * h + (1 - g) * o
    for i in range(cfg.n_coda):
        h = block(h, sd, f"coda.{i}.", cfg.n_head, eps)
    h = layer_norm(h, sd["head.ln_f.weight"], sd["head.ln_f.bias"], eps)
    return h @ sd["embed.wte.weight"].T


def recurrent_ablation_logits(sd, cfg, idx, r, eps_x=None):
    """The sequential ablation's recurrences (paper Fig. 5), written out per switch:
    injection none: o = core(h + eps);  state: o = core(W_h (h + eps));  concat: core(W_proj [h + eps, h_pre]);
    gate none: h <- o (else the full model's gated update, without gate noise here);
    state_noise init: eps only at the first step. eps_x: per-step state noise (list of r tensors) or None."""
    eps = cfg.ln_eps
    h = prelude(sd, cfg, idx)
    h_pre = h
    for step in range(r):
        noisy = eps_x is not None and (cfg.state_noise == "every_step" or step == 0)
        x = h + eps_x[step] if noisy else h
        if cfg.injection == "none":
            o = x
        elif cfg.injection == "state":
            o = x @ sd["recurrence.proj_h.weight"].T
        else:
            o = torch.cat([x, h_pre], -1) @ torch.cat([sd["recurrence.proj_h.weight"],
                                                       sd["recurrence.proj_pre.weight"]], 1).T
        for i in range(cfg.n_rec):
            o = block(o, sd, f"recurrence.blocks.{i}.", cfg.n_head, eps)
        if cfg.gate == "none":
            h = o
            continue
        z = torch.cat([layer_norm(h, sd["recurrence.ln_h.weight"], sd["recurrence.ln_h.bias"], eps),
                       layer_norm(h_pre, sd["recurrence.ln_pre.weight"], sd["recurrence.ln_pre.bias"], eps)], -1)
        a = z @ torch.cat([sd["recurrence.gate_h.weight"], sd["recurrence.gate_pre.weight"]], 1).T \
            + sd["recurrence.gate_h.bias"]
        g = torch.sigmoid((a * torch.sigmoid(a)) @ sd["recurrence.gate_out.weight"].T / cfg.tau
                          + sd["recurrence.gate_out.bias"] / cfg.tau)
        h = g * h + (1 - g) * o
    for i in range(cfg.n_coda):
        h = block(h, sd, f"coda.{i}.", cfg.n_head, eps)
    h = layer_norm(h, sd["head.ln_f.weight"], sd["head.ln_f.bias"], eps)
    return h @ sd["embed.wte.weight"].T


# --- Incremental decoding with K/V caches (SPEC section 5), written out naively -----------------


def attention_with_past(x, sd, p, n_head, past):
    """x (B, T, d): new tokens after P cached ones. past: (K, V) each (B, n_head, P, hd), or None.
    Returns (output (B, T, d), (k_new, v_new) each (B, n_head, T, hd)). Query t (position P + t)
    sees keys 0..P + t."""
    B, T, d = x.shape
    hd = d // n_head
    qkv = x @ sd[p + "qkv.weight"].T + sd[p + "qkv.bias"]
    P = 0 if past is None else past[0].shape[2]
    allowed = torch.tensor([[j <= P + t for j in range(P + T)] for t in range(T)])
    heads, ks, vs = [], [], []
    for h in range(n_head):
        base = h * 3 * hd
        q, k, v = (qkv[..., base + j * hd: base + (j + 1) * hd] for j in range(3))  # (B, T, hd)
        ks.append(k)
        vs.append(v)
        k_all = k if past is None else torch.cat([past[0][:, h], k], dim=1)  # (B, P + T, hd)
        v_all = v if past is None else torch.cat([past[1][:, h], v], dim=1)
        scores = (q @ k_all.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~allowed, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v_all)
    y = torch.cat(heads, dim=-1) @ sd[p + "proj.weight"].T + sd[p + "proj.bias"]
    return y, (torch.stack(ks, dim=1), torch.stack(vs, dim=1))


def block_with_past(x, sd, p, n_head, eps, past):
    a, kv = attention_with_past(layer_norm(x, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], eps), sd, p + "attn.",
                                n_head, past)
    x = x + a
    m = layer_norm(x, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], eps)
    m = gelu_tanh(m @ sd[p + "mlp.fc.weight"].T + sd[p + "mlp.fc.bias"])
    return x + m @ sd[p + "mlp.proj.weight"].T + sd[p + "mlp.proj.bias"], kv


def _gate(sd, h, h_pre, tau, eps):
    z = torch.cat([layer_norm(h, sd["recurrence.ln_h.weight"], sd["recurrence.ln_h.bias"], eps),
                   layer_norm(h_pre, sd["recurrence.ln_pre.weight"], sd["recurrence.ln_pre.bias"], eps)], -1)
    w_fc = torch.cat([sd["recurrence.gate_h.weight"], sd["recurrence.gate_pre.weight"]], dim=1)  # (d, 2d)
    a = z @ w_fc.T + sd["recurrence.gate_h.bias"]
    a = a * torch.sigmoid(a)
    return torch.sigmoid((a @ sd["recurrence.gate_out.weight"].T + sd["recurrence.gate_out.bias"]) / tau)


def recurrent_gpt_cached_logits(sd, cfg, chunks, r, strategy):
    """Feeds the token chunks (each (B, T_c)) one call at a time, keeping a dict of stored K/V per
    layer: every step's K/V of each core block for 'full'; otherwise one entry per core block whose
    new rows are, after the call, the step-0 ('first'), step-(r-1) ('last') or step-mean ('average')
    K/V. Returns the logits of every call."""
    eps, store, pos, out = cfg.ln_eps, {}, 0, []

    def run(name, x, p):
        return block_with_past(x, sd, p, cfg.n_head, eps, store.get(name))

    def append(name, kv):
        store[name] = kv if name not in store else tuple(torch.cat([a, b], dim=2) for a, b in zip(store[name], kv))

    for idx in chunks:
        T = idx.shape[1]
        h = sd["embed.wte.weight"][idx] + sd["embed.wpe.weight"][pos:pos + T]
        for i in range(cfg.n_pre):
            h, kv = run(f"pre{i}", h, f"prelude.{i}.")
            append(f"pre{i}", kv)
        h_pre, per_step = h, {j: [] for j in range(cfg.n_rec)}
        w_proj = torch.cat([sd["recurrence.proj_h.weight"], sd["recurrence.proj_pre.weight"]], dim=1)
        for step in range(r):
            o = torch.cat([h, h_pre], dim=-1) @ w_proj.T
            for j in range(cfg.n_rec):
                name = f"core{step}.{j}" if strategy == "full" else f"core{j}"
                o, kv = run(name, o, f"recurrence.blocks.{j}.")
                per_step[j].append(kv)
            g = _gate(sd, h, h_pre, cfg.tau, eps)
            h = g * h + (1 - g) * o
        pick = {"first": lambda s: s[0], "last": lambda s: s[-1], "average": lambda s: torch.stack(s).mean(0)}
        for j in range(cfg.n_rec if r > 0 else 0):
            if strategy == "full":
                for step in range(r):
                    append(f"core{step}.{j}", per_step[j][step])
            else:  # per_step[j]: r (k, v) pairs -> one (k, v)
                append(f"core{j}", tuple(pick[strategy]([kv[n] for kv in per_step[j]]) for n in range(2)))
        for i in range(cfg.n_coda):
            h, kv = run(f"coda{i}", h, f"coda.{i}.")
            append(f"coda{i}", kv)
        h = layer_norm(h, sd["head.ln_f.weight"], sd["head.ln_f.bias"], eps)
        out.append(h @ sd["embed.wte.weight"].T)
        pos += T
    return out


def poisson_logits(sd, cfg, idx, r, state):
    """Heavy-tail Poisson depth (SPEC section 4): s^(0) = state (B, T, d); s = core(adapter[s, e])."""
    eps = cfg.ln_eps
    e = prelude(sd, cfg, idx)
    adapter = torch.cat([sd["recurrence.adapt_s.weight"], sd["recurrence.adapt_e.weight"]], dim=1)  # (d, 2d)
    s = state
    for _ in range(r):
        s = torch.cat([s, e], dim=-1) @ adapter.T
        for i in range(cfg.n_rec):
            s = block(s, sd, f"recurrence.blocks.{i}.", cfg.n_head, eps)
    for i in range(cfg.n_coda):
        s = block(s, sd, f"coda.{i}.", cfg.n_head, eps)
    s = layer_norm(s, sd["head.ln_f.weight"], sd["head.ln_f.bias"], eps)
    return s @ sd["embed.wte.weight"].T


def _lin(x, sd, p, lora, name, scale):
    """x W^T + b, plus scale * x A^T B^T from the step's adapter `lora + name` when given."""
    y = x @ sd[p + "weight"].T + sd[p + "bias"]
    if lora is not None:
        y = y + scale * (x @ sd[f"{lora}{name}.A.weight"].T) @ sd[f"{lora}{name}.B.weight"].T
    return y


def lora_block(x, sd, p, n_head, eps, lora, scale):
    """A GPT-2 block whose four projections carry the LoRA adapters under prefix `lora`."""
    B, T, d = x.shape
    hd = d // n_head
    a = layer_norm(x, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], eps)
    qkv = _lin(a, sd, p + "attn.qkv.", lora, "qkv", scale)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    heads = []
    for h in range(n_head):
        q, k, v = (qkv[..., h * 3 * hd + j * hd: h * 3 * hd + (j + 1) * hd] for j in range(3))
        heads.append(torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(mask, float("-inf")), -1) @ v)
    x = x + _lin(torch.cat(heads, -1), sd, p + "attn.proj.", lora, "attn_proj", scale)
    m = layer_norm(x, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], eps)
    m = gelu_tanh(_lin(m, sd, p + "mlp.fc.", lora, "fc", scale))
    return x + _lin(m, sd, p + "mlp.proj.", lora, "mlp_proj", scale)


def relaxed_logits(sd, cfg, idx, r):
    """Relaxed Recursive Transformer: step i runs the shared core with adapters i."""
    eps, scale = cfg.ln_eps, cfg.lora_alpha / cfg.lora_rank
    h = prelude(sd, cfg, idx)
    for step in range(r):
        for j in range(cfg.n_rec):
            h = lora_block(h, sd, f"recurrence.blocks.{j}.", cfg.n_head, eps, f"recurrence.adapters.{step}.{j}.", scale)
    for i in range(cfg.n_coda):
        h = block(h, sd, f"coda.{i}.", cfg.n_head, eps)
    h = layer_norm(h, sd["head.ln_f.weight"], sd["head.ln_f.bias"], eps)
    return h @ sd["embed.wte.weight"].T


def ouro_readouts(sd, cfg, idx, targets, r):
    """Ouro (SPEC section 4), written out: s^(t) = core(s^(t-1)) from s^(0) = prelude output; every
    iteration read out through coda + head. Returns per iteration t = 1..r the token losses (B, T)
    (explicit log-softmax over the real vocabulary) and the exit gate lambda_t (B, T)."""
    eps = cfg.ln_eps
    s = prelude(sd, cfg, idx)
    losses, lambdas = [], []
    for _ in range(r):
        for i in range(cfg.n_rec):
            s = block(s, sd, f"recurrence.blocks.{i}.", cfg.n_head, eps)
        c = s
        for i in range(cfg.n_coda):
            c = block(c, sd, f"coda.{i}.", cfg.n_head, eps)
        z = layer_norm(c, sd["head.ln_f.weight"], sd["head.ln_f.bias"], eps) @ sd["embed.wte.weight"][:cfg.vocab_size].T
        logp = z - torch.logsumexp(z, dim=-1, keepdim=True)
        losses.append(-logp.gather(-1, targets[..., None]).squeeze(-1))
        g = layer_norm(c, sd["exits.gate.ln.weight"], sd["exits.gate.ln.bias"], eps) @ sd["exits.gate.proj.weight"][0]
        lambdas.append(torch.sigmoid(g + sd["exits.gate.proj.bias"][0]))
    return losses, lambdas


def ouro_exit_probs(lambdas):
    """p(t) = lambda_t prod_{j<t} (1 - lambda_j) for t < r, and p(r) = prod_{j<r} (1 - lambda_j)."""
    r, out = len(lambdas), []
    for t in range(r):
        stay = torch.ones_like(lambdas[0])
        for j in range(t):
            stay = stay * (1 - lambdas[j])
        out.append(stay * lambdas[t] if t < r - 1 else stay)
    return out


def ouro_objective(sd, cfg, idx, targets, r):
    """(J, CE_r): J = mean over tokens of sum_t p(t) CE_t - beta H(p), H = -sum_t p(t) log p(t)."""
    losses, lambdas = ouro_readouts(sd, cfg, idx, targets, r)
    p = ouro_exit_probs(lambdas)
    expected = sum(pt * lt for pt, lt in zip(p, losses))
    entropy = -sum(pt * torch.log(pt) for pt in p)
    return (expected - cfg.entropy_beta * entropy).mean(), losses[-1].mean()


def mor_forward(sd, cfg, idx, r, routing):
    """Mixture-of-Recursions (SPEC section 4), one sequence at a time with the routes chosen by
    sorting Python lists. routing: 'top_k' (expert choice in training: the ceil(c_i T) best-scored
    candidates), 'threshold' (expert choice at inference: candidates with sigmoid(score) > 1/2; all
    where c_i = 1) or 'token' (token choice: each token's depth and scale from softmax(W h^(0)),
    the balancing loss).
    Returns (logits (B, T, V_padded), auxiliary loss, routes: [recursion][row] -> sorted positions)."""
    eps, N = cfg.ln_eps, cfg.n_loops
    B, T = idx.shape
    h = prelude(sd, cfg, idx)
    rows, candidates = [h[b] for b in range(B)], [list(range(T)) for _ in range(B)]
    aux, routes = 0.0, []
    if routing == "token":  # depths chosen once from h^(0): argmax of softmax(W h) over N, + 1
        probs = torch.softmax(h @ sd["recurrence.router.weight"].T, dim=-1)   # (B, T, N)
        depth, g_tok = probs.argmax(-1) + 1, cfg.router_alpha * probs.max(-1).values
        share = torch.stack([(depth == j + 1).to(probs.dtype).mean() for j in range(N)])
        aux = cfg.router_aux_coef * N * (share * probs.mean((0, 1))).sum() if r > 0 else 0.0
    for i in range(r):
        c = (N - i) / N if i < N else 0.0
        w = sd["recurrence.router.weight"][i] if i < N else None
        bce_sum, count, chosen_rows = 0.0, 0, []
        for b in range(B):
            x_b, cand = rows[b], candidates[b]
            z = x_b @ w if w is not None else torch.zeros(T, dtype=x_b.dtype)
            if routing == "token":
                chosen = [t for t in cand if int(depth[b, t]) > i]
            elif routing == "top_k":
                chosen = sorted(sorted(cand, key=lambda t: -float(z[t].detach()))[:math.ceil(c * T)])
            else:
                chosen = list(cand) if c >= 1 else [t for t in cand if float(z[t].detach()) > 0] if c > 0 else []
            for t in cand if routing != "token" else []:  # BCE of sigmoid(z) vs the route, over the candidates
                p = torch.sigmoid(z[t])
                bce_sum = bce_sum - (torch.log(p) if t in chosen else torch.log(1 - p))
            count += len(cand)
            if chosen:
                x = x_b[chosen][None]                                     # (1, k, d), position order
                o = x
                for j in range(cfg.n_rec):
                    o = block(o, sd, f"recurrence.blocks.{j}.", cfg.n_head, eps)
                g = g_tok[b, chosen] if routing == "token" else cfg.router_alpha * torch.sigmoid(z[chosen])
                upd = x[0] + g[:, None] * (o[0] - x[0])
                rows[b] = torch.stack([upd[chosen.index(t)] if t in chosen else x_b[t] for t in range(T)])
            chosen_rows.append(chosen)
            candidates[b] = chosen
        routes.append(chosen_rows)
        if i < N and routing != "token":
            aux = aux + cfg.router_aux_coef * bce_sum / max(count, 1)
    h = torch.stack(rows)
    for i in range(cfg.n_coda):
        h = block(h, sd, f"coda.{i}.", cfg.n_head, eps)
    h = layer_norm(h, sd["head.ln_f.weight"], sd["head.ln_f.bias"], eps)
    return h @ sd["embed.wte.weight"].T, aux, routes
