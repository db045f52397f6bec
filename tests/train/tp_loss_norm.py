"""Under torchrun with 2 processes: the tensor-parallel factory's cross-entropy with loss_norm
example and token on each rank's shard of tests.train.test_loss_norm's planted logits."""
import json
import sys

import torch.distributed as dist

from rgpt_dist.parallel.tensor_parallel import TensorParallelFactory, init_tensor_parallel
from tests.train.test_loss_norm import VOCAB, planted_batch

dist.init_process_group("gloo")
rank, tp = dist.get_rank(), dist.get_world_size()
init_tensor_parallel(tp)
logits, targets = planted_batch()
shard = logits.shape[-1] // tp
mine = logits[..., rank * shard:(rank + 1) * shard].float()
factory = TensorParallelFactory()
out = {}
for norm in ("example", "token"):
    factory.loss_norm = norm
    out[norm] = factory.cross_entropy(mine, targets, VOCAB).item()
with open(f"{sys.argv[1]}.{rank}.json", "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
