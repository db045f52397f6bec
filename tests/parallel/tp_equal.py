"""Under torchrun with 2 processes: tp = 2 forward and gradients against tp = 1 with the same weights,
each difference beside the tp = 1 reference's distance from its float64 twin (`*_ref`) and the
quantity's scale, from which the tests derive their bounds (tests/helpers/tolerance.py)."""
import copy
import json
import sys

import torch
import torch.distributed as dist

from rgpt_dist.config import GPT2Config, RecurrentGPTConfig
from rgpt_dist.noise import NoiseKey
from rgpt_dist.parallel.reshard import layout_for, merge_state_dicts, split_state_dict, tp_layout
from rgpt_dist.parallel.tensor_parallel import TensorParallelFactory, init_tensor_parallel
from rgpt_dist.registry import build_model

COMMON = dict(vocab_size=300, pad_vocab_multiple=256, block_size=32, d_model=64, n_head=4)


def compare(cfg, rank, tp, **kwargs):
    ref = build_model(cfg, seed=0)
    with torch.no_grad():  # non-trivial biases and norms
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model = build_model(cfg, factory=TensorParallelFactory())
    layout = tp_layout(model)
    assert layout_for(cfg) == layout, "the layout read off megatron layers differs from the model's requests"
    model.load_state_dict(split_state_dict(ref.state_dict(), layout, rank, tp))
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab_size, (2, 17), generator=g)
    x, y = idx[:, :-1], idx[:, 1:].clone()
    y[0, :3] = -1  # ignored positions
    exact = copy.deepcopy(ref).double()
    ref.train(), model.train(), exact.train()
    a, b, e = ref(x, y, **kwargs), model(x, y, **kwargs), exact(x, y, **kwargs)
    a.loss.backward(), b.loss.backward(), e.loss.backward()
    shard = b.logits.shape[-1]
    out = {"loss": (a.loss - b.loss).abs().item(), "loss_ref": (a.loss.double() - e.loss).abs().item(),
           "loss_scale": e.loss.abs().item(),
           "logits": (a.logits[..., rank * shard:(rank + 1) * shard] - b.logits).abs().max().item(),
           "logits_ref": (a.logits.double() - e.logits).abs().max().item(), "logits_scale": e.logits.abs().max().item()}
    grads = {k: p.grad for k, p in model.named_parameters()}
    gathered = []
    for r in range(tp):  # every rank's grads, for the merge
        gathered.append({k: v.clone() for k, v in grads.items()})
    for k, v in grads.items():
        if layout[k] is not None:
            parts = [torch.empty_like(v) for _ in range(tp)]
            dist.all_gather(parts, v.contiguous())
            for r in range(tp):
                gathered[r][k] = parts[r]
    full_grads = merge_state_dicts(gathered, layout)
    ref_grads = {k: p.grad for k, p in ref.named_parameters()}
    out["grads"] = max((full_grads[k] - ref_grads[k]).abs().max().item() for k in ref_grads)
    exact_grads = {k: p.grad for k, p in exact.named_parameters()}
    out["grads_ref"] = max((ref_grads[k].double() - exact_grads[k]).abs().max().item() for k in ref_grads)
    out["grads_scale"] = max(g.abs().max().item() for g in exact_grads.values())
    out["n_params"] = len(ref_grads)
    # resharding round trip: split -> merge is the identity, bitwise
    shards = [split_state_dict(ref.state_dict(), layout, r, tp) for r in range(tp)]
    merged = merge_state_dicts(shards, layout)
    out["roundtrip_bitwise"] = all(torch.equal(merged[k], ref.state_dict()[k]) for k in layout)
    return out


def main():
    dist.init_process_group("gloo")
    rank, tp = dist.get_rank(), dist.get_world_size()
    init_tensor_parallel(tp)
    results = {
        "gpt2": compare(GPT2Config(n_layer=2, **COMMON), rank, tp),
        "recurrent_gpt": compare(RecurrentGPTConfig(n_pre=1, n_rec=2, n_coda=1, n_loops=4, sigma_x=0.3,
                                                    sigma_g=0.3, **COMMON), rank, tp,
                                 r=3, noise_key=NoiseKey(seed=5, step=2, micro_batch=1)),
        # the core's LayerScale gains (issue #28): replicated, multiplying the all-reduced branch outputs
        "recurrent_gpt_layerscale": compare(RecurrentGPTConfig(n_pre=1, n_rec=2, n_coda=1, n_loops=4, layerscale=0.1,
                                                               **COMMON), rank, tp,
                                            r=3, noise_key=NoiseKey(seed=5, step=2, micro_batch=1)),
    }
    with open(f"{sys.argv[1]}.{rank}.json", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
