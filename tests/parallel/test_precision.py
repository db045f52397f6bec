"""parallel.dtype (docs/performance.md, "Precision"): the DeepSpeed config of each value, what
bf16-autocast buys RecurrentGPT's recurrence over DeepSpeed's bf16 mode, and megatron's linear layers
under CPU autocast. One process, no process group."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from rgpt_dist.config import load_config
from rgpt_dist.parallel.dims import ParallelDims
from rgpt_dist.parallel.deepspeed_lib import use_cpu_accelerator
from rgpt_dist.parallel.zero import ds_config
from rgpt_dist.registry import build_model


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "bf16-autocast"])
def test_ds_config_precision(dtype):
    """As DeepSpeed parses our config: bf16 mode (bf16 module weights) only for `bf16`; for
    `bf16-autocast` bf16 and fp16 modes off (fp32 weights, gradients and optimizer: ZeRO keeps fp32
    partitions) and torch_autocast on in bfloat16, with no module's gradients communicated in bf16."""
    use_cpu_accelerator()
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = load_config("configs/experiments/quickstart.yaml", [f"parallel.dtype={dtype}"])
    parsed = DeepSpeedConfig(ds_config(cfg, ParallelDims(world=1, tp=1, rank=0, local_rank=0)))
    assert parsed.bfloat16_config.enabled == (dtype == "bf16") and not parsed.float16_config.enabled
    assert parsed.torch_autocast_enabled == (dtype == "bf16-autocast")
    if dtype == "bf16-autocast":
        assert parsed.torch_autocast_dtype == torch.bfloat16
        assert parsed.torch_autocast_lower_precision_safe_modules == []


def recurrence_delta(model, idx, r, autocast):
    """h^(r) - h^(0) (fp32) of an eval forward, read from the recurrence module's calls, and the
    residual stream's dtype."""
    calls = []
    hook = model.recurrence.register_forward_hook(lambda m, args, out: calls.append((args[0], out[0])))
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model(idx, idx, r=r)
    finally:
        hook.remove()
    return (calls[-1][1].float() - calls[0][0].float()), calls[-1][1].dtype


@pytest.mark.parametrize("r", [1, 4])
def test_autocast_keeps_the_recurrence_closer_to_fp32_than_bf16_weights(r):
    """RecurrentGPT debug model at init (gate ~0.98, so h^(r) - h^(0) is a small update of h): its
    relative error against fp32 under torch.autocast over fp32 weights (residual stream and lerp in
    fp32) is below that of bf16 weights and activations (DeepSpeed's bf16 mode). Measured (d=64,
    vocab 512, B=4, T=64): r=1 0.086 vs 0.122, r=4 0.083 vs 0.103."""
    cfg = load_config("recurrentgpt-debug", ["model.vocab_size=512"]).model
    model = build_model(cfg, seed=0).eval()
    idx = torch.randint(0, cfg.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0))
    ref, ref_dtype = recurrence_delta(model, idx, r, autocast=False)
    auto, auto_dtype = recurrence_delta(model, idx, r, autocast=True)
    bf16, bf16_dtype = recurrence_delta(copy.deepcopy(model).to(torch.bfloat16), idx, r, autocast=False)
    assert (ref_dtype, auto_dtype, bf16_dtype) == (torch.float32, torch.float32, torch.bfloat16)
    err_auto = ((auto - ref).norm() / ref.norm()).item()
    err_bf16 = ((bf16 - ref).norm() / ref.norm()).item()
    assert 0 < err_auto < err_bf16, (err_auto, err_bf16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the patches apply only where CUDA is absent")
def test_megatron_linear_under_cpu_autocast_matches_torch():
    """rgpt_dist.parallel.megatron_cpu: megatron's linear autograd function, declared for CUDA
    autocast only, runs its backward under CPU autocast as F.linear does: output and gradients
    bitwise equal to F.linear's under torch.autocast("cpu", bfloat16) (unpatched: a dtype error)."""
    from rgpt_dist.parallel.megatron_cpu import apply_cpu_compat

    apply_cpu_compat()
    from megatron.core.tensor_parallel.layers import LinearWithGradAccumulationAndAsyncCommunication as Linear

    def run(linear):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4, 8, generator=g, requires_grad=True)
        w = torch.randn(6, 8, generator=g, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = linear(x, w)
        (y.float() ** 2).sum().backward()
        return y, x.grad, w.grad

    got = run(lambda x, w: Linear.apply(x, w, None, False, False, False, None, 0, None))
    expected = run(F.linear)
    assert [t.dtype for t in got] == [torch.bfloat16, torch.float32, torch.float32]
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_mfu_peak_is_bf16_for_both_bf16_modes(monkeypatch):
    """MFU's peak on a known GPU: the datasheet bf16 peak for bf16 and bf16-autocast (its matmuls
    run in bf16), half of it for fp32."""
    from rgpt_dist.train.metrics import peak_flops

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    peaks = {dtype: peak_flops(dtype)[0] for dtype in ("fp32", "bf16", "bf16-autocast")}
    assert peaks == {"fp32": 989.4e12 / 2, "bf16": 989.4e12, "bf16-autocast": 989.4e12}
