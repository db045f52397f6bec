"""Under the forked launcher (2 ranks, gloo): Trainer._depth_agrees with equal depths on both ranks
(one, then one per micro-batch) passes; with depths that differ on one rank it must raise on every
rank. Writes what each call did to ARGV[1].RANK.json."""
import json
import sys
import types

import torch.distributed as dist

from rgpt_dist.train.trainer import Trainer

dist.init_process_group("gloo")
rank = dist.get_rank()
trainer = types.SimpleNamespace(step=7)  # _depth_agrees reads only the step number
results = {}
for name, r in (("same", 3), ("same per micro-batch", [2, 4]), ("none (dense)", None),
                ("differ", 3 + rank), ("differ in one micro-batch", [2, 4 + rank])):
    try:
        Trainer._depth_agrees(trainer, r)
        results[name] = "agreed"
    except RuntimeError as e:
        results[name] = str(e)
with open(f"{sys.argv[1]}.{rank}.json", "w") as f:
    json.dump(results, f)
dist.destroy_process_group()
