import math

import pytest
import torch
import transformers

from rgpt_dist.config import GPT2Config
from rgpt_dist.models.gpt2.model import GPT2, from_hf_state_dict


def hf_model(cfg: GPT2Config, seed=0):
    torch.manual_seed(seed)
    hf_cfg = transformers.GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.d_model,
                                     n_layer=cfg.n_layer, n_head=cfg.n_head, layer_norm_epsilon=cfg.ln_eps,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(hf_cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorms and biases, so every mapped tensor matters
        for name, p in model.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("n_head", [1, 4])
def test_logits_match_transformers_gpt2(n_head):
    cfg = GPT2Config(vocab_size=320, block_size=64, d_model=64, n_head=n_head, n_layer=3)
    ref = hf_model(cfg)
    ours = GPT2(cfg).eval()
    ours.load_state_dict(from_hf_state_dict(ref.state_dict(), cfg.n_head))
    idx = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(idx, labels=idx)
        got = ours(idx, targets=torch.cat([idx[:, 1:], torch.full_like(idx[:, :1], -1)], 1))
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=0)


def test_gpt2_init_scales_residual_projections():
    cfg = GPT2Config(vocab_size=256, block_size=32, d_model=256, n_head=4, n_layer=8)
    torch.manual_seed(0)
    m = GPT2(cfg)
    scaled = 0.02 / math.sqrt(2 * cfg.n_layer)
    projs = torch.cat([m.blocks[i].mlp.proj.weight.flatten() for i in range(cfg.n_layer)])
    fcs = torch.cat([m.blocks[i].mlp.fc.weight.flatten() for i in range(cfg.n_layer)])
    assert abs(projs.std().item() - scaled) / scaled < 0.02
    assert abs(fcs.std().item() - 0.02) / 0.02 < 0.02
    assert all(b.mlp.fc.bias.abs().sum() == 0 for b in m.blocks)
    assert m.head.wte[0].weight is m.embed.wte.weight  # tied head


def test_gpt2_rejects_recurrence_arguments_and_long_sequences():
    cfg = GPT2Config(vocab_size=64, block_size=8, d_model=32, n_head=2, n_layer=1)
    m = GPT2(cfg)
    with pytest.raises(ValueError, match="no recurrence"):
        m(torch.zeros(1, 4, dtype=torch.long), r=2)
    with pytest.raises(ValueError, match="block_size=8"):
        m(torch.zeros(1, 9, dtype=torch.long))
