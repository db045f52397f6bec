"""What the Recurrent Looped Transformer carries between positions (paper section 2.4, Appendix
I.2-I.3): each decoder layer's window ring of its last W - 1 keys/values and the fed-back state
register. One class serves training (a fresh carry per forward, updated out of place so autograd
sees every step; truncated BPTT detaches it) and incremental decoding (`KVCache.carry`, made by the
model's first forward on a cache and updated in place, so a fixed-shape decode step writes the same
buffers every token, as CUDA graphs need).

An RLT cache (`RLT.make_cache`) is a KVCache whose `layers` are the n_enc encoder blocks' ordinary
K/V stores, then the memory groups' stores (one K/V per position, appended as tokens arrive:
rgpt_dist.models.kv_cache), plus this carry:

    keys[l], values[l]   (B, H_local, W - 1, hd)  decoder layer l's ring: position p sits in slot
                                                   p mod (W - 1); keys are stored rotated (RoPE)
    pos                  (W - 1,) long             the position each slot holds (NO_POSITION: empty),
                                                   shared by the layers (they see the same tokens)
    state                (B, d) or None (RLT-0)    h_k: s* until a chunk of B positions completes,
                                                   then that chunk's last decoder output

The position within the chunk is the cache's length mod B (a fixed-shape step: its slot index mod
B), so it is not stored twice. A partial chunk keeps the register (paper I.3). Attention order over
the ring differs from the sequence order, which softmax does not see (rounding aside).

Bytes (`KVCache.nbytes`, static stores of max_len tokens, e bytes per element): (n_enc + G) x 2 x B x
max_len x d x e for the stores (G = 0 without decoder layers) + n_dec x 2 x B x (W - 1) x d x e for
the rings + B x d x e for the state (RLT-1/2). The carry cannot be rolled back: cropping a cache
(beam search, speculative decoding) is not exact for RLT.
"""
from __future__ import annotations

import torch

NO_POSITION = -(2 ** 62)
"""The position of an empty ring slot: outside every window (q - NO_POSITION >= W)."""


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """(C,) query and (N,) key positions -> (C, N) boolean, True where the key is visible: causal
    (k <= q) and, with a window, within it (q - k < window)."""
    vis = k_pos[None, :] <= q_pos[:, None]                            # (C, N)
    return vis if window is None else vis & (k_pos[None, :] > q_pos[:, None] - window)


class DecoderCarry:
    """The decoder's window rings and the fed-back state (module docstring). inplace: buffers are
    written in place (a cache, inference only); else every update makes new tensors (training)."""

    def __init__(self, n_layers: int, window: int, inplace: bool):
        self.ring, self.inplace = window - 1, inplace
        self.keys: list[torch.Tensor | None] = [None] * n_layers   # (B, H_local, W - 1, hd) each
        self.values: list[torch.Tensor | None] = [None] * n_layers  # (allocated by start)
        self.pos: torch.Tensor | None = None                      # (W - 1,) long
        self.state: torch.Tensor | None = None                    # (B, d)

    def start(self, state: torch.Tensor | None, like: torch.Tensor, ring: tuple[int, ...]) -> None:
        """Before the first chunk: h_0 = state (s* per row, (B, d)) or None (RLT-0), rings of zeros
        of shape `ring` (B, H_local, W - 1, hd) in like's dtype and device, empty slot positions. A
        no-op once started (a cache's later forwards)."""
        if self.pos is not None:
            return
        self.pos = torch.full((self.ring,), NO_POSITION, dtype=torch.long, device=like.device)
        self.keys = [like.new_zeros(ring) for _ in self.keys]
        self.values = [like.new_zeros(ring) for _ in self.values]
        if state is not None:
            self.state = state.clone() if self.inplace else state
        if self.inplace and like.is_cuda:  # written in place by CUDA graphs
            for t in [self.pos] + self.tensors():
                torch._dynamo.mark_static_address(t)

    def window_mask(self, pos: torch.Tensor, window: int) -> torch.Tensor:
        """The window self-attention mask of a chunk at positions pos (C,): (C, W - 1 + C) over
        [ring slots, the chunk's own keys]."""
        return visible(pos, torch.cat([self.pos, pos]), window)

    def slots(self, pos: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """(n, slots): the chunk's last n = min(C, W - 1) positions go to ring slots pos mod (W - 1)
        (n,); (0, None) at W = 1 (no ring)."""
        n = min(pos.shape[0], self.ring)
        return (n, pos[-n:] % self.ring) if n else (0, None)

    def write(self, i: int, k: torch.Tensor, v: torch.Tensor, n: int, slots: torch.Tensor | None) -> None:
        """Keeps layer i's last n keys/values of the chunk (B, H_local, C, hd) in their slots."""
        if n == 0:
            return
        if self.inplace:
            self.keys[i].index_copy_(2, slots, k[:, :, -n:])
            self.values[i].index_copy_(2, slots, v[:, :, -n:])
        else:
            self.keys[i] = self.keys[i].index_copy(2, slots, k[:, :, -n:])
            self.values[i] = self.values[i].index_copy(2, slots, v[:, :, -n:])

    def advance(self, pos: torch.Tensor, n: int, slots: torch.Tensor | None) -> None:
        """After every layer wrote the chunk at positions pos (C,): the slots now hold its last n."""
        if n:
            if self.inplace:
                self.pos.index_copy_(0, slots, pos[-n:])
            else:
                self.pos = self.pos.index_copy(0, slots, pos[-n:])

    def feed_back(self, y: torch.Tensor, complete: bool | torch.Tensor) -> None:
        """h_k = y (B, d), the chunk's last output, if the chunk is complete (a bool, or a () bool
        tensor in a fixed-shape step); a partial chunk keeps the register."""
        if isinstance(complete, torch.Tensor):
            y = torch.where(complete, y, self.state)
        elif not complete:
            return
        if self.inplace:
            self.state.copy_(y)
        else:
            self.state = y

    def detach(self) -> None:
        """Truncated BPTT (paper H.1): stop the gradient through the state and every window ring."""
        self.state = None if self.state is None else self.state.detach()
        self.keys = [None if t is None else t.detach() for t in self.keys]
        self.values = [None if t is None else t.detach() for t in self.values]

    def tensors(self) -> list[torch.Tensor]:
        """The rings and the state (what KVCache.nbytes counts; the slot positions are bookkeeping)."""
        rings = [t for t in self.keys + self.values if t is not None]
        return rings + ([] if self.state is None else [self.state])
