"""The trainer's generic evaluation metrics (`aux['eval_metrics']`, issue #29): Trainer.evaluate
averages them over the validation batches and ranks into the eval record under their own names
(measured 2026-12-03: the record equals the batch means exactly; held to relative 1e-12).
MoR's (its other routing's loss, the routers' agreement) reach metrics.jsonl in a real one-process
run; other families' records keep exactly their old keys and values."""
from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist

from rgpt_dist.config import load_config
from rgpt_dist.models.spec import spec_for
from rgpt_dist.registry import build_model
from tests.helpers.runs import BASE, train

TINY = ["model.d_model=32", "model.n_head=2", "model.vocab_size=512", "model.block_size=32", "train.seq_len=32"]


@pytest.fixture
def single_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Engine:
    """What Trainer.evaluate uses of a DeepSpeed engine: call, eval/train, device."""

    def __init__(self, module):
        self.module, self.device = module, torch.device("cpu")

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def eval(self):
        self.module.eval()

    def train(self):
        self.module.train()


def evaluate(flavour, batches, *overrides):
    """(Trainer.evaluate's record, the model) for `flavour` shrunk to TINY on `batches`."""
    from rgpt_dist.train.trainer import Trainer

    cfg = load_config(flavour, [*TINY, *overrides])
    model = build_model(cfg.model, seed=0)
    trainer = Trainer.__new__(Trainer)
    trainer.cfg, trainer.engine, trainer.step = cfg, Engine(model), 7
    trainer.sampler, trainer.val_batches = spec_for(cfg.model).depth_sampler(cfg.model), batches
    return trainer.evaluate(), model


def val_batches(n=3, B=2, T=16):
    g = torch.Generator().manual_seed(3)
    return [tuple(torch.randint(0, 512, (B, T), generator=g) for _ in range(2)) for _ in range(n)]


@pytest.mark.parametrize("flavour", ["gpt2-debug", "recurrentgpt-debug"])
def test_other_families_eval_records_are_unchanged(flavour, single_rank_group):
    """No eval_metrics: the record is {step, val_loss[, early_exit]} with the batch means, as before."""
    batches = val_batches()
    record, model = evaluate(flavour, batches)
    exits = flavour != "gpt2-debug"
    assert model.training  # evaluate hands the model back in training mode
    with torch.no_grad():
        outs = [model.eval()(x, y, all_exits=exits) for x, y in batches]
    assert set(record) == {"step", "val_loss"} | ({"early_exit"} if exits else set())
    assert record["val_loss"] == pytest.approx(sum(o.loss.item() for o in outs) / 3, rel=1e-12)
    if exits:
        curve = torch.stack([o.aux["exit_losses"] for o in outs]).mean(0).tolist()
        assert record["early_exit"] == pytest.approx(curve, rel=1e-12)


def test_mor_eval_metrics_are_batch_means(single_rank_group):
    """Each metric is the mean over the batches of the model's own values (the ranks' mean: one rank)."""
    batches = val_batches()
    record, model = evaluate("mor-debug", batches)
    with torch.no_grad():
        outs = [model.eval()(x, y, all_exits=True).aux["eval_metrics"] for x, y in batches]
    assert set(record) == {"step", "val_loss", "early_exit", "val_loss_topk", "router_agreement"}
    for name in ("val_loss_topk", "router_agreement"):
        assert record[name] == pytest.approx(sum(o[name].item() for o in outs) / 3, rel=1e-12)
    assert len({round(o["router_agreement"].item(), 9) for o in outs}) > 1  # a mean of different values


def test_tiny_mor_run_logs_both_routings_and_agreement(dataset, tmp_path):
    """A one-process training run (d 32, 2 steps): every eval record carries val_loss_topk and
    router_agreement; the training records do not."""
    recs = train(1, tmp_path / "run", dataset, "model=mor-debug", "model.d_model=32", "model.n_head=2",
                 "train.max_steps=2", "eval.every_steps=1", "eval.batches=2", "checkpoint.every_steps=2", common=BASE)
    evals = [r for r in recs if "val_loss" in r]
    assert [r["step"] for r in evals] == [1, 2]
    for r in evals:
        assert set(r) == {"step", "val_loss", "early_exit", "val_loss_topk", "router_agreement"}
        assert 0.0 <= r["router_agreement"] <= 1.0 and abs(r["val_loss_topk"] - r["val_loss"]) < 1.0
    assert not any("router_agreement" in r for r in recs if "loss" in r)
