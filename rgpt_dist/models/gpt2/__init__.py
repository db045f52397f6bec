"""Dense GPT-2, the baseline of every comparison: config.py (GPT2Config), model.py (GPT2). The
Hugging Face export is transformers' own GPT2LMHeadModel (rgpt_dist.export.hf_dense)."""
from __future__ import annotations

from rgpt_dist.models.flavours import DEBUG_WIDTH, SCALES
from rgpt_dist.models.gpt2.config import GPT2Config
from rgpt_dist.models.rt.config import DENSE_FLAVOURS as RT_DENSE  # the RT's dense partners
from rgpt_dist.models.spec import FamilySpec


def _gpt2(scale: str, n_layer: int) -> dict:
    d, h = SCALES[scale]
    return {"family": "gpt2", "d_model": d, "n_head": h, "n_layer": n_layer}


RLT_BLOCK = {"vocab_size": 277, "pad_vocab_multiple": 1, "bias": False, "norm": "rmsnorm", "mlp": "swiglu",
             "qk_norm": True, "pos_encoding": "rope", "mup_base_width": 512}
"""The RLT paper's decoder-only Transformer baseline (width 512, 4 heads, FFN 1,365, vocabulary
capacity 277, tied head, width-muP at base width 512; docs/models.md derives it from the paper's
parameter counts): pre-norm RMSNorm, QK-norm, RoPE, SwiGLU, no biases."""


def _rlt(n_layer: int, d_model: int = 512, d_ff: int = 1365) -> dict:
    return {"family": "gpt2", **RLT_BLOCK, "d_model": d_model, "n_head": 4, "d_ff": d_ff, "n_layer": n_layer}


class GPT2Spec(FamilySpec):
    name = "gpt2"
    title = "GPT-2"
    table1_row = 0
    config = GPT2Config
    model = "rgpt_dist.models.gpt2.model:GPT2"
    hf_writer = "rgpt_dist.export.hf_dense:write_hf_gpt2"
    flavours = {
        "gpt2-small": _gpt2("small", 12),
        "gpt2-medium": _gpt2("medium", 24),
        "gpt2-large": _gpt2("large", 36),
        "gpt2-debug": {"family": "gpt2", **DEBUG_WIDTH, "n_layer": 4},
        "rlt-transformer-8": _rlt(8),     # 25,314,304 parameters (paper Table 4: 25.31M)
        "rlt-transformer-16": _rlt(16),   # 50,486,272 parameters
        "rlt-transformer-debug": _rlt(4, d_model=128, d_ff=341),  # CPU-sized; muP m = 1/4 transfers lr
        **RT_DENSE,  # rt-dense-*: the RT flavours' shapes and block options, tied head (rgpt_dist.models.rt)
    }
    paper_table1 = {"gpt2-small": (124e6, 1.84e9), "gpt2-medium": (354e6, 7.35e9), "gpt2-large": (774e6, 21.1e9)}
    paper_val_loss = {"gpt2-small": 3.15, "gpt2-medium": 2.84, "gpt2-large": 2.71}


SPEC = GPT2Spec()
__all__ = ["SPEC", "GPT2Config"]
