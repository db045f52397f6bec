"""Dense GPT-2, the baseline of every comparison: config.py (GPT2Config), model.py (GPT2). The
Hugging Face export is transformers' own GPT2LMHeadModel (rgpt_dist.export.hf_dense)."""
from __future__ import annotations

from rgpt_dist.config.flavours import DEBUG_WIDTH, SCALES
from rgpt_dist.models.gpt2.config import GPT2Config
from rgpt_dist.models.spec import FamilySpec


def _gpt2(scale: str, n_layer: int) -> dict:
    d, h = SCALES[scale]
    return {"family": "gpt2", "d_model": d, "n_head": h, "n_layer": n_layer}


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
    }
    paper_table1 = {"gpt2-small": (124e6, 1.84e9), "gpt2-medium": (354e6, 7.35e9), "gpt2-large": (774e6, 21.1e9)}
    paper_val_loss = {"gpt2-small": 3.15, "gpt2-medium": 2.84, "gpt2-large": 2.71}


SPEC = GPT2Spec()
__all__ = ["SPEC", "GPT2Config"]
