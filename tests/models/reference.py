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


def recurrent_gpt_logits(sd, cfg, idx, r, noise=None):
    """SPEC section 1. noise: list of (eps_x, eps_g) per step, or None for no noise."""
    eps = cfg.ln_eps
    T = idx.shape[1]
    h = sd["embed.wte.weight"][idx] + sd["embed.wpe.weight"][:T]
    for i in range(cfg.n_pre):
        h = block(h, sd, f"prelude.{i}.", cfg.n_head, eps)
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
