"""Under torchrun: rank 1 alone gets a NaN gradient; every rank must skip the update."""
import json
import sys

import torch
import torch.distributed as dist

from rgpt_dist.config import TrainConfig
from rgpt_dist.train.optim import make_optimizer

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 3)
opt = make_optimizer(model, TrainConfig())
before = [p.detach().clone() for p in model.parameters()]
model(torch.ones(2, 4)).sum().backward()
if rank == 1:
    model.weight.grad[0, 0] = float("nan")
opt.step()
skipped = opt.last_skipped
unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
state_empty = len(opt.state) == 0
opt.zero_grad()
model(torch.ones(2, 4)).sum().backward()
opt.step()
changed_after = not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
with open(f"{sys.argv[1]}.{rank}.json", "w") as f:
    json.dump({"skipped": skipped, "unchanged": unchanged, "state_empty": state_empty,
               "second_step_applied": changed_after and not opt.last_skipped, "total": opt.skipped_total}, f)
dist.destroy_process_group()
