"""What a thinking task hands the model: one padded batch of examples (torch tensors).

    tokens   [B, T] int64   token ids, PAD_ID (0) after each example's length
    labels   [B]    int64   the binary answer, 0 or 1
    difficulty [B]  int64   hops (graph), nesting depth (logic), chain length (relational)
    readout  [B, K] int64   positions whose final states are concatenated for the classifier head
                            (graph: K = 2, source and target node; sequence tasks: K = 1, the CLS
                            position 0); K is the task's, the same for every example
    roles    [B, T] int64 | None   role ids added as learned embeddings (graph: 1 source, 2 target,
                            0 elsewhere); None = no roles
    attn_mask [B, T, T] bool | None  True where query i may attend key j (graph: the edge j -> i or
                            i == j, on every position including padding, so no row is empty);
                            None = every non-padding key

`to(device)` moves every tensor, so a loader can yield (ThinkingInputs, labels) pairs to a trainer that
calls `t.to(device)` on each element.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from rgpt_dist.thinking.tasks.base import PAD_ID, ThinkingTask, ThinkingTaskError, check_int, check_index, check_split


@dataclasses.dataclass
class ThinkingInputs:
    tokens: torch.Tensor
    labels: torch.Tensor
    difficulty: torch.Tensor
    readout: torch.Tensor
    roles: torch.Tensor | None = None
    attn_mask: torch.Tensor | None = None

    def to(self, device, non_blocking: bool = False) -> "ThinkingInputs":
        return dataclasses.replace(self, **{f.name: (v.to(device, non_blocking=non_blocking) if v is not None else None)
                                            for f in dataclasses.fields(self) for v in [getattr(self, f.name)]})

    def __len__(self) -> int:
        return self.tokens.shape[0]

def collate(task: ThinkingTask, examples, pad_to: int | None = None):
    """Pads examples into one `ThinkingInputs` (the layout above). pad_to: the
    padded length T (None: the longest example); it must hold every example and not exceed max_len."""
    examples = list(examples)
    if not examples:
        raise ThinkingTaskError("a batch needs at least one example, got none")
    longest = max(len(e.tokens) for e in examples)
    width = longest if pad_to is None else check_int("pad_to", pad_to)
    if width < longest or width > task.max_len:
        raise ThinkingTaskError(f"task {task.name!r}: pad_to {width} must lie in {longest}..{task.max_len} "
                                f"(the longest example .. the task's max_len)")
    b = len(examples)
    tokens = np.full((b, width), PAD_ID, dtype=np.int64)
    roles = np.zeros((b, width), dtype=np.int64) if examples[0].roles is not None else None
    mask = None
    if examples[0].attn_mask is not None:
        mask = np.broadcast_to(np.eye(width, dtype=bool), (b, width, width)).copy()  # self-loops on padding
    for i, e in enumerate(examples):
        t = len(e.tokens)
        tokens[i, :t] = e.tokens
        if roles is not None:
            roles[i, :t] = e.roles
        if mask is not None:
            mask[i, :t, :t] = e.attn_mask
    as_t = torch.from_numpy
    return ThinkingInputs(
        tokens=as_t(tokens), labels=torch.tensor([e.label for e in examples], dtype=torch.int64),
        difficulty=torch.tensor([e.difficulty for e in examples], dtype=torch.int64),
        readout=as_t(np.stack([e.readout for e in examples]).astype(np.int64)),
        roles=None if roles is None else as_t(roles), attn_mask=None if mask is None else as_t(mask))


def make_batch(task: ThinkingTask, split: str, indices, difficulty=None, pad_to: int | None = None):
    """Examples `indices` of a split at a difficulty (None: the training mix), padded into one
    ThinkingInputs. Every argument is checked before any example is drawn."""
    check_split(split)
    if difficulty is not None:
        task.check_difficulty(difficulty)
    indices = [check_index(i) for i in indices]
    if not indices:
        raise ThinkingTaskError("make_batch needs at least one index, got none")
    if pad_to is not None and not 1 <= check_int("pad_to", pad_to) <= task.max_len:
        raise ThinkingTaskError(f"task {task.name!r}: pad_to {pad_to} is outside 1..{task.max_len} "
                                f"(the task's max_len)")
    return collate(task, (task.example(split, i, difficulty) for i in indices), pad_to)
