"""A plain training loop for diagnosing RLT on parity and swaps-S5: the model of any flavour, AdamW,
and accuracy by length, without the trainer, its data stream or checkpoints. It is how the CPU probes
of docs/families.md ("Why RLT-1 did not learn parity at first", "Swaps-S5 at CPU scale") were run;
`make rlt` is the protocol.

    .venv/bin/python benchmarks/rlt_parity_probe.py --maxlen 16 --batch 256 --steps 800 \
        --set mup_base_width=128 --eval 16,40,64,256          # learns by step ~350 (seed 42)
    .venv/bin/python benchmarks/rlt_parity_probe.py --maxlen 10 --steps 1200   # muP m = 1/4: stays at ln 2
    .venv/bin/python benchmarks/rlt_parity_probe.py --task s5_swaps --minlen 1 --maxlen 32 --grow 0:300:4 \
        --batch 256 --steps 600 --set mup_base_width=128 --eval 8,16,32,64 --watch 50

Each step draws `batch` bit strings of uniform length in minlen..maxlen (numpy seed = seed + 1000),
tokens BOS + bits (ids 1, 3/4 as rgpt_dist.algorithmic), and scores the parity at the last bit
(`--task s5_swaps`: words of lo..hi swaps, the running product scored at every operation);
AdamW (0.9, 0.95, weight decay 0.1 on matrices, lr / m for muP's hidden matrices as the trainer's
param groups), clip 1, linear warm-up then cosine to 5 % of lr. Accuracy at each `--eval` length is
over 256 fresh strings (numpy seed 7 + length; S5: the final state), not the task's test set.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rgpt_dist.sections import from_dict  # noqa: E402
from rgpt_dist.models.flavours import flavour  # noqa: E402
from rgpt_dist.models.config import ModelConfig  # noqa: E402
from rgpt_dist.registry import build_model  # noqa: E402
from rgpt_dist.train.optim import param_groups  # noqa: E402
from rgpt_dist.algorithmic.state_tasks import S5Swaps  # noqa: E402


def parity_batch(n: int, lo: int, hi: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n strings of lo..hi bits -> tokens (n, hi + 1), targets (n, hi + 1) (-100 but at the last bit)."""
    lengths, T = rng.integers(lo, hi + 1, size=n), hi + 1
    tok, tgt = np.zeros((n, T), np.int64), np.full((n, T), -100, np.int64)
    for i, length in enumerate(lengths):
        bits = rng.integers(0, 2, size=length)
        tok[i, 0], tok[i, 1:length + 1], tgt[i, length] = 1, bits + 3, 3 + bits.sum() % 2
    return torch.from_numpy(tok), torch.from_numpy(tgt)


def s5_batch(n: int, lo: int, hi: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n swaps-S5 words of lo..hi operations -> tokens and targets (n, hi + 1): the running product at
    every operation (the task's own encoding), -100 on BOS and padding."""
    tok, tgt = np.zeros((n, hi + 1), np.int64), np.full((n, hi + 1), -100, np.int64)
    task = S5Swaps()
    gens = np.asarray(task.generators)
    for i, length in enumerate(rng.integers(lo, hi + 1, size=n)):
        sample = task.encode(gens[rng.integers(0, len(gens), size=length)])
        tok[i, :length + 1], tgt[i, :length + 1] = sample.tokens, sample.targets
    return torch.from_numpy(tok), torch.from_numpy(tgt)


BATCHES = {"parity": parity_batch, "s5_swaps": s5_batch}


def model_of(name: str, sets: list[str]) -> torch.nn.Module:
    """The flavour's model with `key=value` field changes (ints, floats and strings as the field's type)."""
    fields = flavour(name)
    for item in sets:
        key, value = item.split("=", 1)
        fields[key] = type(fields[key])(value) if key in fields else value
    return build_model(from_dict(ModelConfig, fields, "model"))


@torch.no_grad()
def accuracy(model: torch.nn.Module, length: int, n: int = 256, task: str = "parity") -> float:
    """Accuracy at the last position of `n` fresh sequences of `length` (parity's bit, S5's final state)."""
    x, y = BATCHES[task](n, length, length, np.random.default_rng(7 + length))
    return (model(x).logits[:, -1].argmax(-1) == y[:, -1]).float().mean().item()


def longest(a: argparse.Namespace, step: int) -> int:
    """The longest training string at `step`: --maxlen, or the --grow curriculum's."""
    if not a.grow:
        return a.maxlen
    start, end, first = map(int, a.grow.split(":"))
    f = min(1.0, max(0.0, (step - start) / max(1, end - start)))
    return round(first + f * (a.maxlen - first))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="parity", choices=sorted(BATCHES))
    p.add_argument("--flavour", default="rlt-debug")
    p.add_argument("--set", nargs="*", default=[], help="model field changes, e.g. mup_base_width=128 n_dec=1")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--minlen", type=int, default=3)
    p.add_argument("--maxlen", type=int, default=40)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval", default="10,20,40,64", help="comma-separated test lengths")
    p.add_argument("--grow", default="", help="START:END:FROM: the longest training string grows linearly "
                   "from FROM bits at step START to --maxlen at step END (a length curriculum)")
    p.add_argument("--watch", type=int, default=0, help="every N steps, accuracy at the --eval lengths")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = model_of(a.flavour, a.set)
    groups = param_groups(model, 0.1)
    for g in groups:
        g["lr"] = g["base_lr"] = a.lr * g.get("lr_scale", 1.0)
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95))
    rng, t0 = np.random.default_rng(a.seed + 1000), time.time()
    for step in range(a.steps):
        progress = (step - a.warmup) / max(1, a.steps - a.warmup)
        f = (step + 1) / (a.warmup + 1) if step < a.warmup else 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress))
        for g in groups:
            g["lr"] = g["base_lr"] * f
        x, y = BATCHES[a.task](a.batch, a.minlen, longest(a, step), rng)
        loss = F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == a.steps - 1:
            print(f"step {step} loss {loss.item():.4f} grad {norm:.2f} max {longest(a, step)} "
                  f"{time.time() - t0:.0f}s", flush=True)
        if a.watch and (step + 1) % a.watch == 0:
            model.eval()
            acc = {n: round(accuracy(model, n, task=a.task), 3) for n in map(int, a.eval.split(","))}
            print(f"  step {step + 1} accuracy {acc}", flush=True)
            model.train()
    model.eval()
    print("accuracy", {n: round(accuracy(model, n, task=a.task), 3) for n in map(int, a.eval.split(","))}, flush=True)


if __name__ == "__main__":
    main()
