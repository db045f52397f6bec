"""Under torchrun (1 process): one optimizer step of the real trainer with a depth per micro-batch
(model.depth_per=micro_batch), against a hand loop over the same micro-batches at the same depths.
argv: the output JSON path, then config overrides."""
import json
import sys
from pathlib import Path

import torch

from rgpt_dist.config import load_config
from rgpt_dist.parallel.zero import init_distributed, init_engine
from rgpt_dist.registry import build_model
from rgpt_dist.train.metrics import MetricsSink
from rgpt_dist.train.optim import make_optimizer, make_scheduler
from rgpt_dist.train.run import _loaders
from rgpt_dist.train.trainer import Trainer

out_path, overrides = Path(sys.argv[1]), sys.argv[2:]
cfg = load_config("configs/experiments/quickstart.yaml", overrides)
dims = init_distributed(cfg)
model = build_model(cfg.model, seed=cfg.train.seed)
optimizer = make_optimizer(model, cfg.train)
engine = init_engine(model, optimizer, make_scheduler(optimizer, cfg.train), cfg, dims)
train_loader, _ = _loaders(cfg, dims)
trainer = Trainer(cfg, dims, engine, optimizer, train_loader, [], None, MetricsSink(cfg, False), None)
trainer._data = trainer._batches()
record = trainer.train_step()

# the hand loop: the same initial weights and micro-batches, each at its logged depth, mean loss
depths = record["r"] if isinstance(record["r"], list) else [record["r"]] * trainer.accum
batches = [b for _, b in zip(range(trainer.accum), iter(_loaders(cfg, dims)[0]))]
norms = {}
for name, rs in (("logged depths", depths), ("first depth only", [depths[0]] * len(depths))):
    hand = build_model(cfg.model, seed=cfg.train.seed).train()
    for (x, y), r in zip(batches, rs):
        out = hand(x, y, r=r)
        ((out.loss + out.aux.get("aux_loss", 0.0)) / len(rs)).backward()
    norms[name] = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in hand.parameters())).item()
out_path.write_text(json.dumps({"depths": depths, "trainer": record["grad_norm"], "hand": norms}))
torch.distributed.destroy_process_group()
