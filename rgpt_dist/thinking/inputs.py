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

import torch


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
