"""Config -> DeepSpeed engine (ZeRO stage, precision, accumulation, clipping)."""
from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d
import torch.distributed as dist

from rgpt_dist.config.experiment import Config
from rgpt_dist.parallel.deepspeed_lib import deepspeed, register_external_parameter, set_z3_leaf_module
from rgpt_dist.parallel.dims import ParallelDims


def trainer_clips(cfg: Config) -> bool:
    """Whether the trainer, not DeepSpeed, computes the gradient norm and clips: ZeRO-0 outside
    DeepSpeed's bf16 optimizer. There the engine would clip through clip_fp32_gradients(), which
    sums per-tensor float32 norms (a 10M-element tensor's is 3.6e-4 relative off on CPU, measured
    2026-12-05: the run's trajectory moved away from its float64 twin by 25x as much as ZeRO-3's) and
    drops the norm it computed; the trainer's (rgpt_dist.train.optim.global_grad_norm) is accumulated in
    float64, as DeepSpeed's ZeRO 1-3 optimizers do."""
    return cfg.parallel.zero_stage == 0 and cfg.parallel.dtype != "bf16"


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
        "gradient_clipping": 0.0 if trainer_clips(cfg) else t.grad_clip,
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
        from megatron.core import parallel_state  # megatron-core (seconds to import) only where tensor parallelism runs

        return getattr(parallel_state, self._ALIASES.get(name, name))


def register_tied_parameters(model: torch.nn.Module) -> None:
    """ZeRO-3 gathers a parameter in the hook of the module that owns it, or, in eager mode, when
    another module reads it (DeepSpeed's parameter dict intercepts the access). A compiled forward
    reads the tied embedding without that interception and would see the partitioned, empty tensor:
    registering it as the reader's external parameter makes the reader's own hook gather it. The
    readers are modules with `tied_parameters()` (the LM head). Call before deepspeed.initialize."""
    for module in model.modules():
        for param in getattr(module, "tied_parameters", list)():
            register_external_parameter(module, param)


def gather_per_unit(engine, units: list[torch.nn.Module]) -> None:
    """ZeRO-3 with compiled units (parallel.compile=blocks): gather each unit's parameters in the
    unit's own hooks, which run outside its compiled forward, instead of in every submodule's.

    DeepSpeed hooks every submodule (fetch before forward, release after; the same around backward)
    and those hooks are opaque to dynamo: the graph of a compiled Block broke at each of its Linears
    and LayerNorms (32 breaks in the debug model). Here the hooks DeepSpeed registered on a unit's
    submodules are removed and the unit is flagged a ZeRO-3 "leaf", which makes its own hooks fetch
    and release every parameter beneath it. The flag is set after deepspeed.initialize on purpose:
    DeepSpeed's leaf modules, flagged before, also reduce their gradients in the leaf's backward hook,
    once per call, and the shared core runs r times per forward. Set afterwards, gradients stay on
    the per-parameter hooks (reduced once, when autograd has summed every step's contribution).
    Call after init_engine; the unit's parameters are gathered for the unit's whole forward and backward."""
    offload = engine.optimizer.parameter_offload
    inner = [m for unit in units for m in unit.modules() if m is not unit]
    hook_dicts = {id(d) for m in inner for d in (m._forward_pre_hooks, m._forward_hooks)}
    for handles in (offload.forward_hooks, offload.backward_hooks):
        kept = []
        for handle in handles:
            if id(handle.hooks_dict_ref()) in hook_dicts:
                handle.remove()
            else:
                kept.append(handle)
        handles[:] = kept
    for unit in units:
        set_z3_leaf_module(unit, True)


def init_engine(model: torch.nn.Module, optimizer, scheduler, cfg: Config, dims: ParallelDims):
    """deepspeed.initialize with our optimizer and schedule (stepped by the engine at boundaries)."""
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                      config=ds_config(cfg, dims), mpu=MegatronMPU() if dims.tp > 1 else None)
    return engine


def init_distributed(cfg: Config) -> ParallelDims:
    """The process group (nccl on GPUs, gloo on CPU) and this process's place in it."""
    backend = cfg.parallel.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dims = ParallelDims.from_env(cfg.parallel.tp_size)
    if torch.cuda.is_available():
        torch.cuda.set_device(dims.local_rank)
    timeout = set_collective_timeout(cfg.parallel.timeout_s)
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
    _set_local_world_size()
    return dims


def set_collective_timeout(seconds: float) -> timedelta:
    """Every collective of the run waits `seconds` (parallel.timeout_s) for its peers, after which a
    stalled or lost rank ends the job (rgpt_dist/parallel/health.py names it). The world group takes
    it from init_process_group, but a group created later without an explicit timeout takes
    torch.distributed's module default instead (30 minutes for gloo, 10 for NCCL), and DeepSpeed's
    data-parallel groups, where ZeRO reduces every gradient, are made so (`new_group(ranks)`): a rank
    stopped mid-step then held its peers for 30 minutes. So that default is set to ours, before any
    group exists; megatron's groups take it from init_tensor_parallel."""
    timeout = timedelta(seconds=seconds)
    c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout
    return timeout


def _set_local_world_size() -> None:
    """mosaicml-streaming elects one shared-memory leader per node from LOCAL_WORLD_SIZE, which
    torchrun sets but the deepspeed launcher (LOCAL_SIZE) and srun do not: without it every process
    thinks it leads its node and they collide on the same shared-memory names."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return

    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    os.environ["LOCAL_WORLD_SIZE"] = str(hosts.count(socket.gethostname()))
