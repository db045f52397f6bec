"""Under torchrun with 2 CPU processes: megatron's scatter-to-tp-region backward, unpatched and patched."""
import json
import sys

import torch
import torch.distributed as dist

from megatron.core.tensor_parallel import mappings


def scatter_grad(x: torch.Tensor) -> torch.Tensor:
    """Backward of scatter_to_tensor_model_parallel_region: the full gradient of a replicated input."""
    x = x.clone().requires_grad_()
    local = mappings.scatter_to_tensor_model_parallel_region(x)           # (2, 3, 4 / tp)
    (local * (dist.get_rank() + 1)).sum().backward()
    return x.grad


def main():
    dist.init_process_group("gloo")
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=dist.get_world_size())
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    out = {}
    try:
        scatter_grad(x)
        out["unpatched"] = "ok"
    except (AssertionError, RuntimeError) as e:
        out["unpatched"] = str(e)
    from rgpt_dist.parallel.megatron_cpu import apply_cpu_compat

    out["applied"] = apply_cpu_compat()
    out["applied_again"] = apply_cpu_compat()
    out["grad"] = scatter_grad(x).tolist()
    with open(f"{sys.argv[1]}.{dist.get_rank()}.json", "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
