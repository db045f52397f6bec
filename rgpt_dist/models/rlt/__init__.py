"""The Recurrent Looped Transformer (RLT-0/1/2) as the family `rlt`: config.py (RLTConfig, FLAVOURS),
model.py (RLT), cache.py (the carry of the decoder: window rings and state).

Counting (rgpt_dist.flops; d = d_model, f = the FFN width, k = 3 SwiGLU / 2 GELU matrices, W the
window, B the feedback interval, G the memory groups, S the sequence length; t = 1..S):
- a "block" is a layer run per token: the n_enc encoder Blocks and the n_dec decoder layers
  (unique_blocks = block_executions = n_enc + n_dec); each costs Eq. 1's 8 d^2 + 2 k d f + 4 S d;
- a decoder layer adds cross-attention's q and output maps (4 d^2) and replaces the 4 S d of full
  attention by its own reads: self-attention over min(W, t) keys and the memory over t keys
  (4 d (min(W, t) + t) at position t, averaged over the sequence);
- the memory: G x 4 d^2 (W_K and W_V over every position; none at n_dec = 0);
- the merge (RLT-1/2): the gate's token half 2 d^2 per token, its state half and W_s 4 d^2 once per
  chunk of B (the state is fixed within a chunk): 2 d^2 + 4 d^2 / B; RLT-0 none;
- the head 2 d V apart, as every family.
What runs (`executed_sequence_flops`, torch's counter) differs only in the attention and the merge:
each chunk of c positions (anchored at position 0: the last may be partial) attends over a ring of
W - 1 slots plus the chunk, and over the memory up to the chunk's last position; the merge's state
half runs once per chunk, partial ones included. At RLT-1 (c = 1, S >= W) the window reads W keys
where the architecture reads min(W, t): the ring's empty slots are masked, not skipped.

Parameters: a decoder layer is a block plus the cross-attention's two d x d maps, its QK-norm gain
and a third norm; a memory group W_K, W_V (2 d^2), its input norm and key norm; the merge W_g
(2 d^2 + d), W_s (d^2), RMSNorm_s and s* (the paper's 787,968 at d = 512). Table 4's counts hold
exactly (tests/models/rlt).

Declared unsupported (`refusals`, each quoted by its refusal): tensor parallelism (config
validation, before any process group), and by config
validation parallel.compile=model (`run_problems`; ZeRO 0-3 all run). rgpt-export writes
the native export and the Hugging Face one of the looped families (rgpt_dist.export.hf_looped_writer:
this package's model.py and cache.py shipped as remote code, no recurrence depth). Imports no torch.
"""
from __future__ import annotations

from typing import Any

from rgpt_dist.models.rlt.config import FLAVOURS, RLTConfig
from rgpt_dist.models.spec import FamilySpec, block_flops


def _split(n_enc: int, n_dec: int) -> dict:
    """An RLT-1 split at the paper's block (Table 7's sixteen-layer series: its width, heads and FFN
    are the eight-layer models', as the Transformer 16's)."""
    return {**FLAVOURS["rlt1-4+4"], "n_enc": n_enc, "n_dec": n_dec}


def _tiny(feedback_interval: int) -> dict:
    """The test-sized model: width 32, 4 heads, FFN 85 (8/3 d, as 1,365 at 512), 2 + 2 layers."""
    return {**FLAVOURS["rlt1-4+4"], "d_model": 32, "d_ff": 85, "n_enc": 2, "n_dec": 2,
            "feedback_interval": feedback_interval}


SIXTEEN = {f"rlt1-{e}+{16 - e}": _split(e, 16 - e) for e in range(8, 17)}
"""Table 7's sixteen-layer RLT-1 splits, 8 + 8 ... 16 + 0."""

VARIANTS = {f"rlt{v}-{e}+{8 - e}": {**_split(e, 8 - e), "feedback_interval": b} for v, b in ((0, 0), (2, 4))
            for e in range(5, 9)}
"""J.9's feedback variants at the other eight-layer splits: RLT-0 and RLT-2 (B = 4) at 5 + 3 ... 8 + 0
(4 + 4 is in FLAVOURS). RLT-0 has 787,968 fewer parameters than RLT-1 at each split, RLT-2 the same."""


def _attention_keys(cfg: Any, seq_len: int) -> float:
    """Keys read per decoder layer, summed over positions t = 1..S: min(W, t) in the window, t in
    the memory (the architecture's reads)."""
    W = cfg.window
    return float(sum(min(W, t) + t for t in range(1, seq_len + 1)))


def _chunks(cfg: Any, seq_len: int) -> list[tuple[int, int]]:
    """(first position, length) of each chunk the model runs: B positions from 0 (1 for RLT-1; the
    last may be partial), or the whole sequence for RLT-0."""
    C = cfg.feedback_interval or seq_len
    return [(s, min(C, seq_len - s)) for s in range(0, seq_len, C)]


class RLTSpec(FamilySpec):
    name = "rlt"
    title = "RLT"
    config = RLTConfig
    model = "rgpt_dist.models.rlt.model:RLT"
    flavours = {**FLAVOURS, **SIXTEEN, **VARIANTS, "rlt1-debug": _tiny(1), "rlt2-debug": _tiny(2),
                "rlt0-debug": _tiny(0)}
    dense_reference = {**{name: "rlt-transformer-8" for name in FLAVOURS if name != "rlt-debug"},
                       **{name: "rlt-transformer-16" for name in SIXTEEN},
                       **{name: "rlt-transformer-8" for name in VARIANTS}, "rlt-debug": "rlt-transformer-debug"}
    kv_strategies = ("full",)
    hf_writer = "rgpt_dist.export.hf_looped_writer:write_hf_looped"  # ships model.py, cache.py (remote code)
    supports_tp = False
    refusals = {
        "supports_tp": "no tp = 2 run of RLT has been compared with tp = 1 yet (its layers declare their splits; "
                       "the per-position decoder would all-reduce 3 x n_dec times per chunk)",
    }

    def run_problems(self, cfg: Any) -> list[str]:
        """Tensor parallelism (declared); parallel.compile=model: one graph would unroll the
        per-chunk decoder loop (S / B chunks x n_dec layers; `blocks` compiles the encoder Blocks and
        the head and leaves the loop eager). ZeRO-3 runs: every parameter is read inside its own
        module's forward (W_g as the merge's two Linears, rgpt_dist.models.rlt.model), where ZeRO-3's
        per-module hooks gather it."""
        out = super().run_problems(cfg)
        if cfg.parallel.compile == "model":
            out.append("parallel.compile=model is not supported by model family 'rlt': the whole forward would "
                       "unroll its per-chunk decoder loop (seq_len / B chunks x n_dec layers) into one graph; "
                       "use parallel.compile=blocks")
        return out

    def layout(self, cfg: Any, r: int | None = None) -> str:
        """'RLT-1 4+4', 'RLT-2 4+4 B=4', 'RLT-0 4+4' (encoder + decoder layers)."""
        B = cfg.feedback_interval
        return f"{cfg.variant} {cfg.n_enc}+{cfg.n_dec}" + (f" B={B}" if B > 1 else "")

    # ---- parameters -------------------------------------------------------------------------
    def unique_blocks(self, cfg: Any) -> int:
        return cfg.n_enc + cfg.n_dec

    def recurrent_blocks(self, cfg: Any) -> int:
        """0: RLT recurs over time (the state carried from chunk to chunk), not over depth: each
        encoder block and decoder layer runs once per token, as in a dense model, and the merge runs
        once per chunk. Every Transformer reuses its weights at every position, so "reused per token"
        does not separate N_rec from N_once; the looped law's r (recurrence depth) has no counterpart
        here, and all parameters are N_once (r = 1)."""
        return 0

    def extra_params(self, cfg: Any) -> int:
        """Beyond n_enc + n_dec blocks: per decoder layer cross-attention q and out (2 d^2, biases 2 d),
        its q-norm gain (head_dim) and a third norm; per memory group W_K W_V (2 d^2, biases 2 d), its
        input norm and key norm; the merge W_g and b_g (2 d^2 + d), W_s (d^2), RMSNorm_s and s* (d)."""
        d, hd = cfg.d_model, cfg.head_dim
        norm = 2 * d if cfg.bias and cfg.norm == "layernorm" else d
        qk = hd if cfg.qk_norm else 0
        bias = 2 * d if cfg.bias else 0
        decoder = cfg.n_dec * (2 * d * d + bias + qk + norm)
        memory = (cfg.mem_groups if cfg.n_dec else 0) * (2 * d * d + bias + norm + qk)
        merge = 3 * d * d + d + norm + d if cfg.feedback_interval else 0
        return decoder + memory + merge

    # ---- FLOPs per token ----------------------------------------------------------------------
    def block_executions(self, cfg: Any, r: float | None = None) -> float:
        return float(cfg.n_enc + cfg.n_dec)

    def _fixed_flops(self, cfg: Any) -> float:
        """Per token, whatever S: the memory maps and the decoder's cross-attention q and out maps."""
        d = cfg.d_model
        return float((cfg.mem_groups if cfg.n_dec else 0) * 4 * d * d + cfg.n_dec * 4 * d * d)

    def sequence_flops(self, cfg: Any, seq_len: int, r: float | None = None) -> float:
        """Module docstring: the memory, cross-attention maps, the merge, and the decoder's attention
        reads in place of n_dec x 4 S d."""
        d, B = cfg.d_model, cfg.feedback_interval
        merge = 2 * d * d + 4 * d * d / B if B else 0.0
        attention = cfg.n_dec * 4 * d * (_attention_keys(cfg, seq_len) / seq_len - seq_len)
        return self._fixed_flops(cfg) + merge + attention

    def executed_sequence_flops(self, cfg: Any, seq_len: int, r: float | None = None) -> float:
        """As run: each chunk (s, c) reads W - 1 + c window keys and s + c memory keys per position;
        the merge's state half once per chunk (module docstring)."""
        d, W, chunks = cfg.d_model, cfg.window, _chunks(cfg, seq_len)
        merge = 2 * d * d + 4 * d * d * len(chunks) / seq_len if cfg.feedback_interval else 0.0
        keys = sum(c * ((W - 1 + c) + (s + c)) for s, c in chunks)
        attention = cfg.n_dec * 4 * d * (keys / seq_len - seq_len)
        return self._fixed_flops(cfg) + merge + attention

    def recompute_flops(self, cfg: Any, seq_len: int, r: float | None, mode: str) -> float:
        """The encoder blocks, the only checkpoint units (RLT.checkpoint_units)."""
        return cfg.n_enc * block_flops(cfg, seq_len)

    # ---- inference ----------------------------------------------------------------------------
    def cached_layers(self, cfg: Any, strategy: str, r: int | None) -> int:
        """Full-length K/V stores: the encoder blocks' and the memory groups'. The decoder's rings
        (n_dec x (W - 1) entries) and the state do not grow with the sequence and are not counted."""
        return cfg.n_enc + (cfg.mem_groups if cfg.n_dec else 0)


SPEC = RLTSpec()
__all__ = ["SPEC", "RLTConfig"]
