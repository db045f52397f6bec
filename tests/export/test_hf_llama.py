"""The RLT baseline's block exports as transformers' own Llama / Qwen3 model (rgpt_dist.export.hf_llama):
the loaded model's logits and greedy cached generation equal ours, muP's scalings folded into weights."""
from __future__ import annotations

import json

import pytest
import torch

from rgpt_dist.config import GPT2Config
from rgpt_dist.checkpoints.consolidate import ExportError
from rgpt_dist.export.hf_dense import write_hf_gpt2
from rgpt_dist.registry import build_model

BLOCK = dict(family="gpt2", vocab_size=61, pad_vocab_multiple=8, block_size=32, d_model=32, n_head=4, n_layer=2,
             bias=False, norm="rmsnorm", mlp="swiglu", d_ff=40, pos_encoding="rope", rope_base=500.0)


def _export(cfg: GPT2Config, tmp_path):
    from transformers import AutoModelForCausalLM

    ours = build_model(cfg, seed=3).eval()
    with torch.no_grad():  # gains away from 1, so a norm dropped or misplaced in the export shows
        for name, p in ours.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    write_hf_gpt2(ours.state_dict(), cfg, tmp_path / "hf", dtype=torch.float32)
    return ours, AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True,
                                                      use_safetensors=True).eval()


@pytest.mark.parametrize("qk_norm, mup_base_width, model_type", [(True, 128, "qwen3"), (False, 16, "llama"),
                                                                  (True, 0, "qwen3")])
def test_llama_export_computes_our_logits(tmp_path, qk_norm, mup_base_width, model_type):
    """m = 1/4 and m = 2 (muP's logit and attention scales folded) and standard parametrisation."""
    cfg = GPT2Config(**BLOCK, qk_norm=qk_norm, mup_base_width=mup_base_width)
    ours, hf = _export(cfg, tmp_path)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == model_type
    idx = torch.randint(0, cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ours(idx).logits[..., :cfg.vocab_size]
        got = hf(idx).logits
    assert got.shape == want.shape
    err = (got - want).abs().max().item()
    assert err < 2e-5, err  # fp32, measured ~2e-6


def test_llama_export_generates_as_we_do(tmp_path):
    """Greedy generation with transformers' cache (RoPE at the cached positions) = our argmax by
    recomputing the whole sequence each step."""
    cfg = GPT2Config(**BLOCK, qk_norm=True, mup_base_width=64)
    ours, hf = _export(cfg, tmp_path)
    prompt = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    seq = prompt
    with torch.no_grad():
        for _ in range(12):
            nxt = ours(seq).logits[:, -1, :cfg.vocab_size].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
        got = hf.generate(prompt, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(prompt),
                          pad_token_id=0)
    assert torch.equal(got, seq)


@pytest.mark.parametrize("field, value", [("norm", "layernorm"), ("bias", True), ("pos_encoding", "alibi")])
def test_other_blocks_are_not_exported_as_llama(tmp_path, field, value):
    """One field off the Llama block: the export is refused (GPT2LMHeadModel cannot compute it either)."""
    cfg = GPT2Config(**{**BLOCK, field: value})
    with pytest.raises(ExportError, match=f"model.{field}="):
        write_hf_gpt2(build_model(cfg, seed=0).state_dict(), cfg, tmp_path / "hf", dtype=torch.float32)
    assert not (tmp_path / "hf").exists()
