"""The fp64 reference of the silent-thinking model, written from SPEC section 8's equations with the
model's weights read as plain tensors (a state_dict): attention, LayerNorm, GELU/ReLU, rotary positions,
the gate and the binary cross-entropy by hand. It imports nothing from rgpt_dist and no torch layer or
functional it could be checked against."""
from __future__ import annotations

import math

import torch


def ref_layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def ref_gelu(x):  # exact GELU: x Phi(x)
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def ref_rope(x, base):
    """x [B, H, T, hd]: feature pair (j, j + hd/2) of position p turns by p * base^(-2j / hd)."""
    hd, half = x.shape[-1], x.shape[-1] // 2
    out = torch.empty_like(x)
    for p in range(x.shape[2]):
        for j in range(half):
            a = p * base ** (-2 * j / hd)
            c, s = math.cos(a), math.sin(a)
            x1, x2 = x[:, :, p, j], x[:, :, p, j + half]
            out[:, :, p, j], out[:, :, p, j + half] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


def ref_attention(x, W, mask, cfg):
    """x [B, T, d] (already normed); mask [B, T, T] bool (True: query i sees key j)."""
    Bx, Tx, d = x.shape
    H, hd = cfg.n_head, d // cfg.n_head
    qkv = x @ W["attn.qkv.weight"].T + W["attn.qkv.bias"]
    q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(Bx, Tx, H, hd).transpose(1, 2) for i in range(3))
    if cfg.positions == "rope":
        q, k = ref_rope(q, cfg.rope_base), ref_rope(k, cfg.rope_base)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)                         # [B, H, T, T]
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    p = torch.exp(scores - scores.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    y = (p @ v).transpose(1, 2).reshape(Bx, Tx, d)
    return y @ W["attn.proj.weight"].T + W["attn.proj.bias"]


def ref_residual(x, W, mask, cfg):
    """h' = x + g1 * Attn(LN1 x); h' + g2 * FFN(LN2 h') (g = 1 without LayerScale)."""
    g1, g2 = W.get("gamma1", 1.0), W.get("gamma2", 1.0)
    h = x + g1 * ref_attention(ref_layer_norm(x, W["ln_1.weight"], W["ln_1.bias"], cfg.ln_eps), W, mask, cfg)
    u = ref_layer_norm(h, W["ln_2.weight"], W["ln_2.bias"], cfg.ln_eps) @ W["ffn.fc.weight"].T + W["ffn.fc.bias"]
    u = ref_gelu(u) if cfg.activation == "gelu" else torch.clamp(u, min=0)
    return h + g2 * (u @ W["ffn.proj.weight"].T + W["ffn.proj.bias"])


def ref_step(h, t, W, mask, cfg):
    h_hat = h + W["depth_emb.weight"][t]
    h_new = ref_residual(h_hat, {k.removeprefix("residual."): v for k, v in W.items()}, mask, cfg)
    z = 1 / (1 + torch.exp(-(torch.cat([h_new, h], -1) @ W["gate_proj.weight"].T + W["gate_proj.bias"])))
    return z * h_new + (1 - z) * h


def ref_forward(x, steps, W, cfg, mask):
    """Every step's logit [steps, B] from the raw weights W (the model's state_dict)."""
    h = W["tok_emb.weight"][x.tokens]
    if cfg.n_roles:
        h = h + torch.cat([torch.zeros(1, cfg.d_model, dtype=h.dtype), W["role_emb.weight"]])[x.roles]
    h = ref_layer_norm(h, W["emb_norm.weight"], W["emb_norm.bias"], cfg.ln_eps)
    core = {k.removeprefix("core."): v for k, v in W.items() if k.startswith("core.")}
    out = []
    for t in range(steps):
        h = ref_step(h, t, core, mask, cfg)
        feats = torch.cat([h[torch.arange(len(h)), x.readout[:, j]] for j in range(x.readout.shape[1])], -1)
        u = ref_layer_norm(feats, W["head.0.weight"], W["head.0.bias"], cfg.ln_eps)
        u = ref_gelu(u @ W["head.1.weight"].T + W["head.1.bias"])
        out.append((u @ W["head.4.weight"].T + W["head.4.bias"])[:, 0])
    return torch.stack(out)


def ref_bce(logit, y):
    p = 1 / (1 + torch.exp(-logit))
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
