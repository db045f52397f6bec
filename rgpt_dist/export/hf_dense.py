"""The dense model as a native `transformers.GPT2LMHeadModel` directory (no remote code).

GPT2LMHeadModel has learned absolute positions only, so a dense model with model.pos_encoding rope,
alibi or none has no Hugging Face export: refused (ExportError) rather than written with positions
it would not compute (docs/models.md). The looped families' remote-code export ships our own layers
and supports every encoding. The RLT baseline's block (RMSNorm, SwiGLU, RoPE, no bias, with or
without QK-norm and muP) is transformers' Llama / Qwen3 block and exports as one (hf_llama); any other
block GPT2LMHeadModel does not compute (rmsnorm, swiglu, qk_norm, muP at m != 1) is refused;
a GELU MLP of another width d_ff is GPT-2's n_inner, and a model without biases exports zero ones."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import GPT2Config as HFGPT2Config
from transformers import GPT2LMHeadModel

from rgpt_dist.config import GPT2Config
from rgpt_dist.checkpoints.consolidate import ExportError
from rgpt_dist.export.hf_llama import is_llama_block, llama_mismatch, write_hf_llama


def to_hf_state_dict(sd: dict[str, torch.Tensor], cfg: GPT2Config) -> dict[str, torch.Tensor]:
    """The inverse of rgpt_dist.models.gpt2.from_hf_state_dict: linear weights transposed into GPT-2's
    Conv1D layout, qkv from [head, (q|k|v), hd] back to [(q|k|v), head, hd], the vocabulary padding
    rows dropped, and zero biases where the model has none (GPT-2 always has them)."""
    n_head, d = cfg.n_head, cfg.d_model

    def qkv_to_hf(t: torch.Tensor) -> torch.Tensor:
        return t.view(n_head, 3, d // n_head, *t.shape[1:]).transpose(0, 1).reshape(3 * d, *t.shape[1:])

    def bias(key: str, size: int) -> torch.Tensor:
        return sd[key] if key in sd else torch.zeros(size, dtype=sd["embed.wte.weight"].dtype)

    out = {"transformer.wte.weight": sd["embed.wte.weight"][:cfg.vocab_size],
           "transformer.wpe.weight": sd["embed.wpe.weight"],
           "transformer.ln_f.weight": sd["head.ln_f.weight"], "transformer.ln_f.bias": bias("head.ln_f.bias", d)}
    for i in range(cfg.n_layer):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            out[dst + f"{ln}.weight"] = sd[src + f"{ln}.weight"]
            out[dst + f"{ln}.bias"] = bias(src + f"{ln}.bias", d)
        out[dst + "attn.c_attn.weight"] = qkv_to_hf(sd[src + "attn.qkv.weight"]).t()
        out[dst + "attn.c_attn.bias"] = qkv_to_hf(bias(src + "attn.qkv.bias", 3 * d))
        for mine, theirs, width in (("attn.proj", "attn.c_proj", d), ("mlp.fc", "mlp.c_fc", cfg.ffn_width),
                                    ("mlp.proj", "mlp.c_proj", d)):
            out[dst + f"{theirs}.weight"] = sd[src + f"{mine}.weight"].t()
            out[dst + f"{theirs}.bias"] = bias(src + f"{mine}.bias", width)
    return {k: v.contiguous() for k, v in out.items()}


def write_hf_gpt2(sd: dict[str, torch.Tensor], cfg: GPT2Config, out_dir: Path, *, dtype: torch.dtype,
                  **inference) -> None:
    """config.json + model.safetensors loadable by GPT2LMHeadModel / AutoModelForCausalLM."""
    if inference:
        raise ValueError(f"the dense model has no inference settings ({', '.join(sorted(inference))} given)")
    if is_llama_block(cfg):  # the RLT baseline's block: transformers' own Llama / Qwen3 (hf_llama)
        return write_hf_llama(sd, cfg, out_dir, dtype=dtype)
    unsupported = [f"model.{k}={v!r}" for k, v, plain in (
        ("norm", cfg.norm, "layernorm"), ("mlp", cfg.mlp, "gelu"), ("qk_norm", cfg.qk_norm, False)) if v != plain]
    if cfg.mup_base_width not in (0, cfg.d_model):
        unsupported.append(f"model.mup_base_width={cfg.mup_base_width} (muP's logit and attention scales at "
                           f"d_model={cfg.d_model})")
    if unsupported:
        raise ExportError(f"{', '.join(unsupported)}: the dense model's Hugging Face export is a stock GPT2LMHeadModel "
                          "(LayerNorm, GELU MLP, no QK-norm, standard parametrisation), which cannot compute this "
                          f"model, nor is it the Llama / Qwen3 block ({llama_mismatch(cfg)}); use the native checkpoint "
                          "(rgpt_dist.checkpoints.consolidate)")
    if cfg.pos_encoding != "learned":
        raise ExportError(f"model.pos_encoding={cfg.pos_encoding!r}: the dense model's Hugging Face export is a stock "
                          "GPT2LMHeadModel, which has learned absolute positions only; export a dense model "
                          "trained with pos_encoding='learned' (looped families export every encoding), or one with "
                          f"the Llama / Qwen3 block, exported as such ({llama_mismatch(cfg)})")

    hf_cfg = HFGPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.d_model,
                          n_layer=cfg.n_layer, n_head=cfg.n_head, layer_norm_epsilon=cfg.ln_eps,
                          n_inner=cfg.d_ff or None,
                          activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          bos_token_id=50256, eos_token_id=50256, tie_word_embeddings=True,
                          torch_dtype=str(dtype).removeprefix("torch."))
    model = GPT2LMHeadModel(hf_cfg)
    state = {k: v.to(dtype) for k, v in to_hf_state_dict(sd, cfg).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # the attention's causal-mask buffers and the tied lm_head are the only keys not in `state`
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"GPT-2 conversion mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.to(dtype).save_pretrained(out_dir, safe_serialization=True)
