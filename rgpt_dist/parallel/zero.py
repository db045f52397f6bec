"""Config -> DeepSpeed engine (ZeRO stage, precision, accumulation, clipping)."""
from __future__ import annotations

import os
from typing import Any

import torch

from rgpt_dist.config.experiment import Config
from rgpt_dist.parallel.dims import ParallelDims


def use_cpu_accelerator() -> None:
    """DeepSpeed picks its accelerator at import: without CUDA it must be told to use the CPU.
    Called before the first `import deepspeed`."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def ds_config(cfg: Config, dims: ParallelDims) -> dict[str, Any]:
    """The DeepSpeed config of a run. Precision (parallel.dtype): `bf16` is DeepSpeed's bf16 mode
    (module weights cast to bf16, fp32 masters in its optimizer); `bf16-autocast` leaves bf16 mode off
    (fp32 weights, optimizer and gradients, as fp32) and turns on DeepSpeed's `torch_autocast`
    section: the engine runs every forward under torch.autocast(bfloat16) on its accelerator's device
    type ("cpu" with DS_ACCELERATOR=cpu). `lower_precision_safe_modules` names the module classes
    whose gradients (and, under ZeRO-3, gathered weights) DeepSpeed communicates in bf16: none here,
    so every reduction is fp32 like the paper's DDP (its default, torch.nn.Linear, matches by exact
    class and so would not reach our Linear subclass or megatron's layers anyway)."""
    t, p = cfg.train, cfg.parallel
    autocast = {"torch_autocast": {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}}
    return {
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.grad_accum_steps(dims.dp),
        "train_batch_size": t.global_batch_size,
        "gradient_clipping": t.grad_clip,
        "zero_optimization": {"stage": p.zero_stage},
        "bf16": {"enabled": p.dtype == "bf16"},
        **(autocast if p.dtype == "bf16-autocast" else {}),
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }


class MegatronMPU:
    """What DeepSpeed's `mpu=` expects, answered by megatron's parallel_state, so that ZeRO shards
    and reduces over the data-parallel group only."""

    _ALIASES = {"get_model_parallel_rank": "get_tensor_model_parallel_rank",
                "get_model_parallel_world_size": "get_tensor_model_parallel_world_size",
                "get_model_parallel_group": "get_tensor_model_parallel_group"}

    def __getattr__(self, name: str):
        from megatron.core import parallel_state

        return getattr(parallel_state, self._ALIASES.get(name, name))


def register_tied_parameters(model: torch.nn.Module) -> None:
    """ZeRO-3 gathers a parameter in the hook of the module that owns it, or, in eager mode, when
    another module reads it (DeepSpeed's parameter dict intercepts the access). A compiled forward
    reads the tied embedding without that interception and would see the partitioned, empty tensor:
    registering it as the reader's external parameter makes the reader's own hook gather it. The
    readers are modules with `tied_parameters()` (the LM head). Call before deepspeed.initialize."""
    use_cpu_accelerator()
    from deepspeed.runtime.zero.partition_parameters import register_external_parameter

    for module in model.modules():
        for param in getattr(module, "tied_parameters", list)():
            register_external_parameter(module, param)


def init_engine(model: torch.nn.Module, optimizer, scheduler, cfg: Config, dims: ParallelDims):
    """deepspeed.initialize with our optimizer and schedule (stepped by the engine at boundaries)."""
    use_cpu_accelerator()
    import deepspeed

    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                      config=ds_config(cfg, dims), mpu=MegatronMPU() if dims.tp > 1 else None)
    return engine


def init_distributed(cfg: Config) -> ParallelDims:
    """The process group (nccl on GPUs, gloo on CPU) and this process's place in it."""
    use_cpu_accelerator()
    import deepspeed

    backend = cfg.parallel.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dims = ParallelDims.from_env(cfg.parallel.tp_size)
    if torch.cuda.is_available():
        torch.cuda.set_device(dims.local_rank)
    deepspeed.init_distributed(dist_backend=backend)
    _set_local_world_size()
    return dims


def _set_local_world_size() -> None:
    """mosaicml-streaming elects one shared-memory leader per node from LOCAL_WORLD_SIZE, which
    torchrun sets but the deepspeed launcher (LOCAL_SIZE) and srun do not: without it every process
    thinks it leads its node and they collide on the same shared-memory names."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return
    import socket

    import torch.distributed as dist

    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    os.environ["LOCAL_WORLD_SIZE"] = str(hosts.count(socket.gethostname()))
