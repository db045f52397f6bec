"""Under torchrun with 4 processes (tp = 2 x dp = 2, megatron's groups: ranks {0, 1} and {2, 3} are
the tensor-parallel pairs, {0, 2} and {1, 3} the data-parallel ones): the RT family at tp = 2 against
one process holding the whole model and the whole batch, with the same weights.

Per config: the tp = 1 reference (every rank builds it, seeded, moved off its init), the tp model
loaded from its split (layout_for must equal the layout read off the megatron layers); a batch of 4
sequences, rows 2 dp_rank .. 2 dp_rank + 1 on each replica (equal numbers of scored tokens per
replica, so the replicas' mean of token means is the reference's token mean). Step 0: loss, logits
(this rank's rows and vocabulary shard) and every gradient (dp-averaged, tp shards gathered and
merged) against the reference's. Then STEPS steps of SGD with momentum on both (dp gradients
averaged over the data-parallel group, as DeepSpeed does) and the final weights: the tp shards
gathered and merged with layout_for (what checkpoint export does) against the reference's. Each tp
rank of replica 0 also writes its final shard, and rank 0 the reference's final state dict and the
trained tp model's logits on one batch, for the pytest side to reshard to tp = 1. Before training:
cached decoding under tp (a prompt prefilled, then one token at a time) against the reference's full
forward. Every difference is recorded beside the same quantity's distance between the reference and
its float64 twin (trained alongside on the whole batch), from which the test derives its bounds.
Writes `{out}.{rank}.json` with the measured differences.
"""
import copy
import json
import sys

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from rgpt_dist.config import RTConfig
from rgpt_dist.parallel.reshard import layout_for, merge_state_dicts, split_state_dict, tp_layout
from rgpt_dist.parallel.tensor_parallel import TensorParallelFactory, init_tensor_parallel
from rgpt_dist.registry import build_model
from tests.helpers.tolerance import max_abs

COMMON = dict(vocab_size=300, pad_vocab_multiple=256, block_size=32, d_model=64, n_head=4, n_layer=2)
CONFIGS = {
    # the authors' block: ALiBi (each rank's slice of the slopes), QK-norm (replicated gains seeing
    # each rank's heads only), RMSNorm, GELU MLP, the untied vocabulary-parallel head; the tiled scan
    "alibi-untied": RTConfig(**COMMON),
    # the other options a split touches: biases (column-split, row biases replicated), RoPE, SwiGLU,
    # LayerNorm, the head tied to the vocabulary-parallel wte; the naive scan
    "rope-tied-bias": RTConfig(**COMMON, bias=True, pos_encoding="rope", mlp="swiglu", d_ff=96, norm="layernorm",
                               qk_norm=False, tie_embeddings=True, prefill="naive"),
    # the authors' options that shard (issue #42; their full-width QK-norm is refused at tp > 1): LayerNorm
    # QK-norm per head, no residual scaling, exact GELU, the geometric slopes of 6 heads (3 per rank: they
    # differ from Press et al.'s), their init
    "authors-head": RTConfig(**{**COMMON, "d_model": 96, "n_head": 6}, norm="layernorm", qk_norm_type="layernorm",
                             residual_scale="none", gelu="exact", alibi_slopes="geometric", init_scheme="authors"),
}
B, T, STEPS, LR = 4, 16, 3, 0.5


def reference(cfg: RTConfig) -> torch.nn.Module:
    ref = build_model(cfg, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # gains, biases and the padding rows shape the output too
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return ref


def batch(cfg: RTConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(100 + step))
    x, y = idx[:, :-1], idx[:, 1:].clone()
    y[0, :3] = y[2, 5:8] = -1  # ignored targets, three on each replica
    return x, y


def gather_merge(tensors: dict[str, torch.Tensor], layout: dict) -> dict[str, torch.Tensor]:
    """Every parameter (or gradient) of the tp = 1 model from this tensor-parallel group's shards."""
    group, tp = parallel_state.get_tensor_model_parallel_group(), parallel_state.get_tensor_model_parallel_world_size()
    shards = [dict(tensors) for _ in range(tp)]
    for k, v in tensors.items():
        if layout[k] is not None:
            parts = [torch.empty_like(v) for _ in range(tp)]
            dist.all_gather(parts, v.contiguous(), group=group)
            for r in range(tp):
                shards[r][k] = parts[r]
    return merge_state_dicts(shards, layout)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    return max(max_abs(a[k], b[k]) for k in a)


def step_both(ref, model, exact, opts, cfg, step, rows, out):
    """One training step of the reference (whole batch), its float64 twin `exact` (the size of the
    reference's own fp32 rounding error on this host: tests/helpers/tolerance.py) and the tp model (its
    rows, gradients averaged over the data-parallel group); at step 0 records the loss, logits and
    gradient differences, each beside the reference's distance from float64 (`*_ref`) and its scale."""
    dp_group, tp_rank = parallel_state.get_data_parallel_group(), parallel_state.get_tensor_model_parallel_rank()
    x, y = batch(cfg, step)
    a, b, e = ref(x, y), model(x[rows], y[rows]), exact(x, y)
    for result in (a, b, e):
        result.loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, group=dp_group)
        p.grad /= 2
    loss = b.loss.detach().clone()
    dist.all_reduce(loss, group=dp_group)
    out.setdefault("loss", []).append(abs(loss.item() / 2 - a.loss.item()))
    out.setdefault("loss_ref", []).append(abs(a.loss.item() - e.loss.item()))
    out.setdefault("loss_scale", []).append(abs(e.loss.item()))
    if step == 0:
        shard = b.logits.shape[-1]
        out["logits"] = (a.logits[rows, :, tp_rank * shard:(tp_rank + 1) * shard] - b.logits).abs().max().item()
        out["logits_ref"], out["logits_scale"] = max_abs(a.logits, e.logits), e.logits.abs().max().item()
        layout = layout_for(cfg)
        out["grads"] = max_diff(gather_merge({k: p.grad for k, p in model.named_parameters()}, layout),
                                {k: p.grad for k, p in ref.named_parameters()})
        out["grads_ref"] = max_diff({k: p.grad for k, p in ref.named_parameters()},
                                    {k: p.grad for k, p in exact.named_parameters()})
        out["grad_scale"] = max(p.grad.abs().max().item() for p in exact.parameters())
    for opt in opts:
        opt.step()
        opt.zero_grad(set_to_none=True)


def decode_check(ref, model, exact, cfg, out):
    """Cached decoding under tp (a prompt of 8 prefilled, then 8 tokens one at a time) against the
    reference's full forward: the max logit difference on this rank's vocabulary shard (`decode`),
    beside the reference's distance from its float64 twin (`decode_ref`) and the logits' scale."""
    ref.eval(), model.eval(), exact.eval()
    x, _ = batch(cfg, 99)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    with torch.no_grad():
        want, want64 = ref(x).logits, exact(x).logits          # (B, T, V)
        cache = model.make_cache()
        got = [model(x[:, :8], cache=cache).logits] + [model(x[:, t:t + 1], cache=cache).logits for t in range(8, T)]
    got = torch.cat(got, dim=1)
    shard = got.shape[-1]
    out["decode"] = max_abs(want[..., tp_rank * shard:(tp_rank + 1) * shard], got)
    out["decode_ref"], out["decode_scale"] = max_abs(want, want64), want64.abs().max().item()


def trained_logits(model, cfg) -> torch.Tensor:
    """The trained tp model's logits (B, T, V_padded) on batch(cfg, 7), its vocabulary shards gathered:
    what the resharded tp = 1 model must compute."""
    model.eval()
    x, _ = batch(cfg, 7)
    with torch.no_grad():
        mine = model(x).logits                                 # (B, T, V_padded / tp)
    parts = [torch.empty_like(mine) for _ in range(parallel_state.get_tensor_model_parallel_world_size())]
    dist.all_gather(parts, mine.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)


def compare(name: str, cfg: RTConfig, out_prefix: str) -> dict:
    rank, tp_rank = dist.get_rank(), parallel_state.get_tensor_model_parallel_rank()
    dp_rank = parallel_state.get_data_parallel_rank()
    ref = reference(cfg)
    model = build_model(cfg, factory=TensorParallelFactory())
    layout = tp_layout(model)
    out = {"layout_for_matches": layout_for(cfg) == layout,
           "split": sorted(k for k, dim in layout.items() if dim is not None)}
    model.load_state_dict(split_state_dict(ref.state_dict(), layout, tp_rank, 2))
    exact = copy.deepcopy(ref).double()
    decode_check(ref, model, exact, cfg, out)
    ref.train(), model.train(), exact.train()
    # SGD with momentum: AdamW's first steps divide each gradient by its own magnitude, so a gradient
    # element near 0 (a token seen once) turns a rounding difference into a step of up to 2 lr
    opts = [torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9) for m in (ref, model, exact)]
    rows = slice(2 * dp_rank, 2 * dp_rank + 2)
    for step in range(STEPS):
        step_both(ref, model, exact, opts, cfg, step, rows, out)
    params = {k: p.detach() for k, p in model.named_parameters()}  # (megatron's state dict adds _extra_state)
    final = gather_merge(params, layout)
    out["weights"] = max_diff(final, ref.state_dict())
    out["weights_ref"] = max_diff(ref.state_dict(), exact.state_dict())
    out["weights_scale"] = max(v.abs().max().item() for v in exact.state_dict().values())
    out["moved"] = max_diff(final, reference(cfg).state_dict())  # the steps changed the weights
    # the data-parallel replicas hold the same weights, bitwise
    mine = torch.cat([v.flatten() for v in params.values()])
    theirs = mine.clone()
    dist.broadcast(theirs, src=tp_rank, group=parallel_state.get_data_parallel_group())  # global rank tp_rank: replica 0's
    out["replicas_bitwise"] = torch.equal(mine, theirs)
    logits = trained_logits(model, cfg)
    if dp_rank == 0:
        torch.save(params, f"{out_prefix}.{name}.shard{tp_rank}.pt")
    if rank == 0:
        torch.save({"ref": ref.state_dict(), "tp_logits": logits}, f"{out_prefix}.{name}.ref.pt")
    return out


def main():
    dist.init_process_group("gloo")
    init_tensor_parallel(2)
    assert dist.get_world_size() == 4 and parallel_state.get_data_parallel_world_size() == 2
    results = {name: compare(name, cfg, sys.argv[1]) for name, cfg in CONFIGS.items()}
    with open(f"{sys.argv[1]}.{dist.get_rank()}.json", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
