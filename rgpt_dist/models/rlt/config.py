"""The Recurrent Looped Transformer's model section (torch-free) and its named sizes.

RLT (the paper in shared/papers/recurrent_looped_transformer.txt, section 2): a causal encoder of
`n_enc` blocks, its key/value memory (`mem_groups` groups), a gated merge of each token's encoder
output with the fed-back state, and `n_dec` decoder layers (sliding-window self-attention, memory
cross-attention, FFN) whose last output is the state. `feedback_interval` selects RLT-1 (1), RLT-2
(B > 1, chunk-parallel) or RLT-0 (0: no feedback, no merge parameters).

`FLAVOURS` are plain mappings; the family spec (rgpt_dist/models/rlt/__init__.py) adds the
16-layer splits and the tiny debug ones.
"""
from __future__ import annotations

import dataclasses

from rgpt_dist.sections import out_of_bounds
from rgpt_dist.models.config import MAX_BLOCK_SIZE, MAX_BLOCKS, ModelConfig

RLT_POS_ENCODINGS = ("learned", "rope", "none")
"""pos_encoding values RLT supports: its decoder and memory attention have no ALiBi bias."""


@dataclasses.dataclass
class RLTConfig(ModelConfig):
    """Causal encoder + memory + gated merge + recurrent decoder (RLT-0/1/2). The block options
    (norm, mlp, d_ff, qk_norm, pos_encoding, mup_base_width) apply to every layer: the paper's model
    uses rmsnorm, swiglu (d_ff 1,365), qk_norm, rope and muP at base width 512 (the flavours)."""

    family: str = "rlt"
    """Model family (fixed for this class)."""
    n_enc: int = 4
    """L_E: causal encoder blocks (shared-layer pre-norm Blocks, parallel over positions);
    0 <= n_enc <= 1024 (0: the encoder output is the token embedding); n_enc + n_dec >= 1."""
    n_dec: int = 4
    """L_D: decoder layers (window self-attention, memory cross-attention, FFN); 0 <= n_dec <= 1024.
    0: no memory is built (nothing reads it) and the state is the merge's output u_t (the paper's
    8 + 0 split keeps the merge)."""
    window: int = 8
    """W: the decoder self-attention window, the current token included (each layer keeps at most
    W - 1 past K/V); 1 <= window <= 2^20."""
    mem_groups: int = 1
    """G: encoder-memory groups, each with its own key/value maps; decoder layer l reads group
    l * G // n_dec (consecutive layers share a group). 1 <= mem_groups, dividing n_dec when
    n_dec > 0 (G = n_dec: one memory per layer); 1 when n_dec = 0."""
    feedback_interval: int = 1
    """B: tokens between updates of the fed-back state. 1 = RLT-1 (every token; the decoder runs
    token by token), B > 1 = RLT-2 (chunks of B positions run in parallel, all merging the state at
    the previous complete chunk's last position), 0 = RLT-0 (no feedback: no merge, no s*, the
    decoder reads the encoder output directly, all positions in parallel); 0 <= B <= 2^20."""
    alpha: float = 0.1
    """The feedback scale of the merge u = e + alpha g * W_s RMSNorm(s) (paper: 0.1; its J.11 tries
    0.03 and 0.01); finite, 0 < alpha <= 1e3. Unused by RLT-0."""

    tbptt: int = 0
    """Truncated backpropagation through time, in positions: 0 = full BPTT; k > 0 = at positions k,
    2k, ... the fed-back state and every decoder layer's window K/V are detached (the paper's H.1
    complete decoder-state detach; the encoder memory still carries gradient across), forward values
    unchanged. 0 <= tbptt <= 2^20; a multiple of feedback_interval for RLT-2 (truncation at chunk
    boundaries); 0 for RLT-0 (no recurrent state). The paper's TBPTT128 covers all its training
    sequences, so the flavours keep 0 (the same gradients)."""

    def problems(self, path: str) -> list[str]:
        out = super().problems(path)
        out += out_of_bounds(path, ">=", 0, n_enc=self.n_enc, n_dec=self.n_dec,
                             feedback_interval=self.feedback_interval)
        out += out_of_bounds(path, "<=", MAX_BLOCKS, n_enc=self.n_enc, n_dec=self.n_dec)
        out += out_of_bounds(path, ">=", 1, window=self.window, mem_groups=self.mem_groups)
        out += out_of_bounds(path, "<=", MAX_BLOCK_SIZE, window=self.window, feedback_interval=self.feedback_interval)
        out += out_of_bounds(path, ">", 0, alpha=self.alpha)
        out += out_of_bounds(path, "<=", 1e3, alpha=self.alpha)
        if self.n_enc >= 0 and self.n_dec >= 0 and self.n_enc + self.n_dec < 1:
            out.append(f"{path}.n_enc={self.n_enc} + {path}.n_dec={self.n_dec} must be >= 1 (a model needs a layer)")
        if self.mem_groups >= 1 and self.n_dec > 0 and self.n_dec % self.mem_groups:
            out.append(f"{path}.mem_groups={self.mem_groups} does not divide {path}.n_dec={self.n_dec} "
                       "(consecutive decoder layers share a memory group)")
        if self.mem_groups > 1 and self.n_dec == 0:
            out.append(f"{path}.mem_groups={self.mem_groups} must be 1 with {path}.n_dec=0 (no layer reads a memory)")
        out += out_of_bounds(path, ">=", 0, tbptt=self.tbptt)
        out += out_of_bounds(path, "<=", MAX_BLOCK_SIZE, tbptt=self.tbptt)
        if self.tbptt > 0 and self.feedback_interval == 0:
            out.append(f"{path}.tbptt={self.tbptt} must be 0 with {path}.feedback_interval=0 (RLT-0 has no "
                       "recurrent state to truncate)")
        if self.tbptt > 0 and self.feedback_interval > 1 and self.tbptt % self.feedback_interval:
            out.append(f"{path}.tbptt={self.tbptt} must be a multiple of {path}.feedback_interval="
                       f"{self.feedback_interval} (RLT-2 truncates at chunk boundaries)")
        if self.pos_encoding == "alibi":
            out.append(f"{path}.pos_encoding={self.pos_encoding!r} is not supported by RLT (one of "
                       f"{', '.join(RLT_POS_ENCODINGS)}): its window and memory attention have no ALiBi bias")
        return out

    @property
    def variant(self) -> str:
        """RLT-0, RLT-1 or RLT-2 (the paper's names for feedback_interval 0, 1, > 1)."""
        return f"RLT-{min(self.feedback_interval, 2)}"


RLT_BLOCK = {"vocab_size": 277, "pad_vocab_multiple": 1, "bias": False, "norm": "rmsnorm", "mlp": "swiglu",
             "qk_norm": True, "pos_encoding": "rope", "mup_base_width": 512}
"""The paper's block (as the gpt2 family's rlt-transformer-* flavours): width 512, 4 heads, FFN
1,365, vocabulary capacity 277, pre-norm RMSNorm, QK-norm, RoPE, SwiGLU, no biases, width-muP."""


def _rlt(n_enc: int, n_dec: int, feedback_interval: int = 1, d_model: int = 512, d_ff: int = 1365) -> dict:
    return {"family": "rlt", **RLT_BLOCK, "d_model": d_model, "n_head": 4, "d_ff": d_ff, "n_enc": n_enc,
            "n_dec": n_dec, "window": 8, "mem_groups": 1, "feedback_interval": feedback_interval, "alpha": 0.1}


FLAVOURS: dict[str, dict] = {
    "rlt1-4+4": _rlt(4, 4),    # 28,726,912 parameters (paper Table 4: 28.73M)
    "rlt1-5+3": _rlt(5, 3),    # 28,201,984 (28.20M)
    "rlt1-6+2": _rlt(6, 2),    # 27,677,056 (27.68M)
    "rlt1-7+1": _rlt(7, 1),    # 27,152,128 (27.15M)
    "rlt1-8+0": _rlt(8, 0),    # 26,102,272 (26.10M): no decoder layer, so no memory K/V
    "rlt0-4+4": _rlt(4, 4, feedback_interval=0),  # 27,938,944 (paper J.3, exactly)
    "rlt2-4+4": _rlt(4, 4, feedback_interval=4),  # 28,726,912: RLT-2 has RLT-1's parameters
    "rlt-debug": _rlt(2, 2, d_model=128, d_ff=341),  # CPU-sized (muP m = 1/4, as rlt-transformer-debug)
}
"""Named sizes (model-section mappings, family included): every 8-layer split of the paper's
Table 4 as RLT-1, its RLT-0 and RLT-2 (B = 4) ablations at 4 + 4, and a CPU-sized debug model."""
