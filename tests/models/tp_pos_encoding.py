"""Under torchrun with 2 processes: tp = 2 against tp = 1 with rope and alibi (tests.parallel.tp_equal's
comparison: forward, loss and every gathered gradient)."""
import json
import sys

import torch.distributed as dist

from rgpt_dist.config import GPT2Config, RecurrentGPTConfig
from rgpt_dist.noise import NoiseKey
from rgpt_dist.parallel.tensor_parallel import init_tensor_parallel
from tests.parallel.tp_equal import COMMON, compare


def main():
    dist.init_process_group("gloo")
    rank, tp = dist.get_rank(), dist.get_world_size()
    init_tensor_parallel(tp)
    results = {  # n_head = 4: each rank holds 2 heads, so its ALiBi slopes are a slice of the 4
        "gpt2/rope": compare(GPT2Config(n_layer=2, pos_encoding="rope", **COMMON), rank, tp),
        "gpt2/alibi": compare(GPT2Config(n_layer=2, pos_encoding="alibi", **COMMON), rank, tp),
        "recurrent_gpt/alibi": compare(RecurrentGPTConfig(n_pre=1, n_rec=1, n_coda=1, n_loops=2, pos_encoding="alibi",
                                                          **COMMON), rank, tp, r=2,
                                     noise_key=NoiseKey(seed=5, step=2, micro_batch=1)),
    }
    with open(f"{sys.argv[1]}.{rank}.json", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
