"""Native RecurrentGPT state dict -> a Hugging Face `trust_remote_code` directory.

    out_dir/config.json            RecurrentGPTHFConfig, with auto_map for AutoConfig / AutoModelForCausalLM
    out_dir/model.safetensors      native parameter names; the tied head stored once (embed.wte.weight)
    out_dir/configuration_rgpt.py  copied from rgpt_dist/export/hf_recurrent/
    out_dir/cache_rgpt.py          (together self-contained: torch + transformers only)
    out_dir/modeling_rgpt.py

Load with `AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True[, r_eval=.., kv_strategy=..])`;
the tie of lm_head to embed.wte is restored by transformers (`_tied_weights_keys`). Tokenizer files are
written elsewhere.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from rgpt_dist.models.recurrent_gpt.config import RecurrentGPTConfig

HF_CODE_DIR = Path(__file__).resolve().parent / "hf_recurrent"
CODE_FILES = ("configuration_rgpt.py", "cache_rgpt.py", "modeling_rgpt.py")
AUTO_MAP = {
    "AutoConfig": "configuration_rgpt.RecurrentGPTHFConfig",
    "AutoModelForCausalLM": "modeling_rgpt.RecurrentGPTForCausalLM",
}


def hf_config(cfg: RecurrentGPTConfig, *, r_eval: int | None = None, kv_strategy: str = "full",
              dtype: torch.dtype = torch.float32):
    """The exported model's RecurrentGPTHFConfig (validates r_eval and kv_strategy)."""
    from rgpt_dist.export.hf_recurrent.configuration_rgpt import RecurrentGPTHFConfig

    config = RecurrentGPTHFConfig(
        vocab_size=cfg.vocab_size, padded_vocab_size=cfg.padded_vocab_size, block_size=cfg.block_size,
        d_model=cfg.d_model, n_head=cfg.n_head, n_pre=cfg.n_pre, n_rec=cfg.n_rec, n_coda=cfg.n_coda,
        n_loops=cfg.n_loops, tau=cfg.tau, ln_eps=cfg.ln_eps, bias=cfg.bias, init_std=cfg.init_std,
        gate_bias_init=cfg.gate_bias_init, r_eval=r_eval, kv_strategy=kv_strategy,
    )
    config.architectures = ["RecurrentGPTForCausalLM"]
    config.auto_map = dict(AUTO_MAP)
    config.dtype = dtype
    return config


def expected_shapes(config) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the HF model (tied head once, as embed.wte.weight), built on meta."""
    from rgpt_dist.export.hf_recurrent.modeling_rgpt import RecurrentGPTForCausalLM

    with torch.device("meta"):
        model = RecurrentGPTForCausalLM(config)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}  # shared lm_head listed once


def write_hf_recurrent(state_dict: dict[str, torch.Tensor], cfg: RecurrentGPTConfig, out_dir: Path, *,
                       r_eval: int | None = None, kv_strategy: str = "full",
                       dtype: torch.dtype = torch.float32) -> Path:
    """Writes the HF directory for a native (tp = 1, consolidated) RecurrentGPT state dict; returns out_dir.
    r_eval: default inference depth R* (None = R = cfg.n_loops); kv_strategy: full|first|last|average;
    dtype: of the stored floating-point tensors."""
    if cfg.family != "recurrent_gpt":
        raise ValueError(f"write_hf_recurrent exports recurrent_gpt models, not {cfg.family!r}")
    config = hf_config(cfg, r_eval=r_eval, kv_strategy=kv_strategy, dtype=dtype)
    shapes = expected_shapes(config)
    missing = sorted(set(shapes) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(shapes))
    wrong = sorted(f"{k}: {tuple(state_dict[k].shape)} != {shapes[k]}" for k in set(shapes) & set(state_dict)
                   if tuple(state_dict[k].shape) != shapes[k])
    if missing or unexpected or wrong:
        raise ValueError("state dict does not match the RecurrentGPT config: "
                         f"missing {missing}, unexpected {unexpected}, wrong shapes {wrong}")

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name in shapes:  # model order; each a fresh contiguous CPU copy (no shared storage)
        t = state_dict[name].detach().to("cpu")
        t = t.to(dtype) if t.is_floating_point() else t
        tensors[name] = t.clone(memory_format=torch.contiguous_format)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out_dir)
    for name in CODE_FILES:
        shutil.copyfile(HF_CODE_DIR / name, out_dir / name)
    return out_dir
