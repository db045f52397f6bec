"""Generates tests/models/data/learned_head.safetensors: every family's state dict (names in order,
values) and logits at seed 1234, from the code before model.pos_encoding existed (run at commit
c2a1ad0, `.venv/bin/python tests/models/data/gen_learned_head.py` from the repository root).
tests/models/test_pos_encoding.py::test_learned_unchanged rebuilds the same models with
pos_encoding=learned and requires their weights bitwise equal and their logits equal to fp32
rounding. Do not regenerate it from newer code."""
import torch
from safetensors.torch import save_file
from rgpt_dist.models.spec import families

FAMS = {"gpt2": dict(n_layer=2), "relaxed": dict(lora_rank=2), "recurrent_gpt": dict(n_pre=1, n_rec=1, n_coda=1, n_loops=2)}
out = {}
for fam in sorted(families()):
    spec = families()[fam]
    cfg_cls = spec.config
    kw = dict(family=fam, vocab_size=32, block_size=16, d_model=8, n_head=2)
    cfg = cfg_cls(**kw, **FAMS.get(fam, {}))
    if cfg.problems("model"):
        print("skip", fam, cfg.problems("model")); continue
    torch.manual_seed(1234)
    model = spec.build(cfg).eval()
    idx = torch.arange(24).view(2, 12) % 32
    with torch.no_grad():
        logits = model(idx).logits
    for i, (k, v) in enumerate(model.state_dict().items()):
        out[f"{fam}/sd/{i:03d}/{k}"] = v.detach().clone().contiguous()
    out[f"{fam}/logits"] = logits.contiguous()
    print(fam, len(model.state_dict()))
save_file(out, "tests/models/data/learned_head.safetensors")
