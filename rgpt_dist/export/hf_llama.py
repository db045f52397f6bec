"""The dense model with the RLT baseline's block as a stock Hugging Face model (no remote code).

A `gpt2`-family model with model.norm = rmsnorm, mlp = swiglu, pos_encoding = rope and no biases
(the rlt-transformer flavours, docs/models.md) computes what transformers' Llama block computes:
pre-norm RMSNorm, q/k/v/o projections without bias, rotate-half RoPE with inv_freq = base^(-2j/hd),
silu(gate) * up -> down, a final RMSNorm and a head tied to the embedding. With model.qk_norm the
block is Qwen3's (RMSNorm over head_dim of q and k, one gain shared by the heads, before RoPE), so:

    qk_norm = false -> LlamaForCausalLM (model_type llama)
    qk_norm = true  -> Qwen3ForCausalLM (model_type qwen3)

Width-muP (mup_base_width, m = d_model / base) has two scalings these classes lack, both folded into
weights exactly: the logits' 1 / m is applied to the normed final state, so it multiplies the final
norm's gain; the attention scale sqrt(base_head_dim) / head_dim is 1 / sqrt(head_dim) x m^(-1/2), and
RoPE is a rotation, so m^(-1/2) multiplies q's norm gain (qk_norm) or q's projection rows (without).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from rgpt_dist.config import GPT2Config
from rgpt_dist.checkpoints.consolidate import ExportError

PLAIN = (("norm", "rmsnorm"), ("mlp", "swiglu"), ("pos_encoding", "rope"), ("bias", False))


def is_llama_block(cfg: GPT2Config) -> bool:
    """Whether the model's block is the one this module exports (RMSNorm, SwiGLU, RoPE, no bias)."""
    return all(getattr(cfg, k) == v for k, v in PLAIN)


def llama_mismatch(cfg: GPT2Config) -> str:
    """What keeps the model's block from being Llama's, e.g. "model.norm='layernorm' (needs 'rmsnorm')"."""
    return ", ".join(f"model.{k}={getattr(cfg, k)!r} (needs {v!r})" for k, v in PLAIN if getattr(cfg, k) != v)


def _muP(cfg: GPT2Config) -> float:
    return cfg.d_model / cfg.mup_base_width if cfg.mup_base_width else 1.0


def to_hf_state_dict(sd: dict[str, torch.Tensor], cfg: GPT2Config) -> dict[str, torch.Tensor]:
    """Our names -> Llama/Qwen3's. qkv's rows are laid out [head, (q|k|v), head_dim] (layers.py):
    q_proj takes the q rows of every head in head order, as do k_proj and v_proj."""
    H, hd, m = cfg.n_head, cfg.head_dim, _muP(cfg)
    q_gain = 1.0 / math.sqrt(m)   # the muP attention scale relative to 1 / sqrt(head_dim)
    out = {"model.embed_tokens.weight": sd["embed.wte.weight"][:cfg.vocab_size],
           "model.norm.weight": sd["head.ln_f.weight"] / m}
    for i in range(cfg.n_layer):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        q, k, v = sd[src + "attn.qkv.weight"].view(H, 3, hd, cfg.d_model).unbind(1)  # each (H, hd, d)
        if cfg.qk_norm:
            out[dst + "self_attn.q_norm.weight"] = sd[src + "attn.q_norm.weight"] * q_gain
            out[dst + "self_attn.k_norm.weight"] = sd[src + "attn.k_norm.weight"]
        else:
            q = q * q_gain
        out.update({dst + "self_attn.q_proj.weight": q.reshape(H * hd, -1),
                    dst + "self_attn.k_proj.weight": k.reshape(H * hd, -1),
                    dst + "self_attn.v_proj.weight": v.reshape(H * hd, -1),
                    dst + "self_attn.o_proj.weight": sd[src + "attn.proj.weight"],
                    dst + "input_layernorm.weight": sd[src + "ln_1.weight"],
                    dst + "post_attention_layernorm.weight": sd[src + "ln_2.weight"],
                    dst + "mlp.gate_proj.weight": sd[src + "mlp.gate.weight"],
                    dst + "mlp.up_proj.weight": sd[src + "mlp.fc.weight"],
                    dst + "mlp.down_proj.weight": sd[src + "mlp.proj.weight"]})
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: GPT2Config, dtype: torch.dtype):
    """The transformers config of the same model (Qwen3Config with qk_norm, LlamaConfig without)."""

    # the export ships GPT-2's tokenizer (rgpt_dist.export.tokenizer_files): its <|endoftext|> where the
    # vocabulary holds it, no special id otherwise (an algorithmic task's vocabulary, docs/algorithmic.md)
    gpt2_eos = 50256 if cfg.vocab_size > 50256 else None
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_width,
                  num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head,
                  head_dim=cfg.head_dim, hidden_act="silu", max_position_embeddings=cfg.block_size,
                  rms_norm_eps=cfg.ln_eps, rope_theta=cfg.rope_base, attention_bias=False, attention_dropout=0.0,
                  tie_word_embeddings=True, bos_token_id=gpt2_eos, eos_token_id=gpt2_eos,
                  torch_dtype=str(dtype).removeprefix("torch."))
    if cfg.qk_norm:
        return Qwen3Config(use_sliding_window=False, **common)
    return LlamaConfig(mlp_bias=False, **common)


def write_hf_llama(sd: dict[str, torch.Tensor], cfg: GPT2Config, out_dir: Path, *, dtype: torch.dtype) -> None:
    """config.json + model.safetensors loadable by AutoModelForCausalLM without remote code."""
    if not is_llama_block(cfg):
        raise ExportError(f"{llama_mismatch(cfg)}: not the block of the Llama / Qwen3 export")

    model = AutoModelForCausalLM.from_config(hf_config(cfg, dtype))
    state = {k: v.to(dtype) for k, v in to_hf_state_dict(sd, cfg).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:  # the tied head is the one key not given
        raise RuntimeError(f"Llama/Qwen3 conversion mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.to(dtype).save_pretrained(out_dir, safe_serialization=True)
