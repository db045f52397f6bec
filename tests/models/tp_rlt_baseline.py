"""Under torchrun with 2 processes: tp = 2 against tp = 1 for the RLT baseline's block (RMSNorm, QK-norm
whose replicated gains see each rank's heads only, SwiGLU with gate and up column-parallel, muP at
m = 2) with tests.parallel.tp_equal's comparison: forward, loss and every gathered gradient."""
import json
import sys

import torch.distributed as dist

from rgpt_dist.config import GPT2Config
from rgpt_dist.parallel.tensor_parallel import init_tensor_parallel
from tests.parallel.tp_equal import COMMON, compare

RLT = dict(norm="rmsnorm", mlp="swiglu", d_ff=96, qk_norm=True, pos_encoding="rope", bias=False, mup_base_width=32)


def main():
    dist.init_process_group("gloo")
    rank, tp = dist.get_rank(), dist.get_world_size()
    init_tensor_parallel(tp)
    results = {"gpt2/rlt": compare(GPT2Config(n_layer=2, **RLT, **COMMON), rank, tp)}
    with open(f"{sys.argv[1]}.{rank}.json", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
