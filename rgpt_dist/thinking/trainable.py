"""The thinking models under the project's trainer (rgpt_dist/train/trainer.py), which calls every
model as `model(x, y, r=..., noise_key=..., stats=...)` for training and `model(x, y, all_exits=...)`
for validation and reads a ModelOutput. Here x is a ThinkingInputs batch, y its labels [B] (the
loader's pair, rgpt_dist/thinking/loader.py) and r the number of thinking steps the spec's sampler
drew for the step (U[train_steps_min, train_steps_max]; None: `default_steps`, the largest trained).

    loss = (1 - a) BCE_final + a mean_t BCE_t      a = model.supervision_alpha (0: silent thinking)
    aux['exit_losses'] [r + 1]                     with all_exits: BCE after steps 0..r (0: the head on
                                                   the embedding; the trainer logs the early-exit curve)
    aux['stats']['accuracy'] [1]                   the final step's accuracy (logged per step)
    aux['eval_metrics']['val_accuracy']            the same in eval mode (the eval record's val_accuracy)

The fixed-depth baseline takes no r (its spec has no sampler) and has one exit, its output.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from rgpt_dist.models.layers import ModelOutput
from rgpt_dist.thinking.inputs import ThinkingInputs
from rgpt_dist.thinking.model import FixedDepthModel, ThinkingModel, thinking_loss


class _TrainerCall:
    """The trainer's forward signature over `logits` (a ThinkingModel's)."""

    cfg: Any

    @property
    def default_steps(self) -> int | None:
        return self.cfg.train_steps_max if self.recurrent else None

    def forward(self, idx: ThinkingInputs, targets: torch.Tensor | None = None, r: int | None = None,
                all_exits: bool = False, noise_key: Any = None, cache: Any = None, stats: bool = False) -> ModelOutput:
        """idx: a ThinkingInputs batch; targets: its labels [B] (None: idx.labels); r: thinking steps."""
        if cache is not None:
            raise ValueError("the thinking models are classifiers: no KV cache, no generation")
        labels = idx.labels if targets is None else targets
        alpha = self.cfg.supervision_alpha
        steps = self.default_steps if r is None else r
        every = self.logits(idx, steps, all_steps=bool(alpha > 0 or all_exits))   # [S, B] or [B]
        final = every[-1] if every.dim() == 2 else every                             # [B]
        loss = thinking_loss(every if alpha > 0 else final, labels, alpha)
        aux: dict[str, Any] = {}
        if all_exits:  # the readout of the embedding itself (no thinking) first: the curve of depths 0..S
            exits = torch.cat([self.readout(self.embed(idx), idx.readout)[None], every.reshape(-1, len(labels))])
            target = labels.to(exits.dtype).expand_as(exits)
            aux["exit_losses"] = F.binary_cross_entropy_with_logits(exits, target, reduction="none").mean(-1)  # [S + 1]
        accuracy = ((final > 0).long() == labels).float().mean().detach()
        if stats:
            aux["stats"] = {"accuracy": accuracy.reshape(1)}
        if not self.training:  # the trainer averages these over the validation batches and ranks
            aux["eval_metrics"] = {"val_accuracy": accuracy}
        return ModelOutput(loss=loss, logits=final, aux=aux)


class TrainableThinking(_TrainerCall, ThinkingModel):
    """ThinkingModel with the trainer's call."""


class TrainableFixedDepth(_TrainerCall, FixedDepthModel):
    """FixedDepthModel (cfg.fixed_layers distinct blocks) with the trainer's call."""

    def __init__(self, cfg: Any, factory: Any = None):
        super().__init__(cfg, cfg.fixed_layers, factory)


def build(cfg: Any, factory: Any = None) -> ThinkingModel:
    """What the spec builds: the fixed-depth baseline when cfg.fixed_layers > 0, else the thinking model."""
    return TrainableFixedDepth(cfg, factory) if cfg.fixed_layers else TrainableThinking(cfg, factory)
