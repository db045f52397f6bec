"""Parameters and FLOPs per family: the single source for `rgpt-flops`, MFU and grid cost estimates.

Forward FLOPs per token at sequence length S follow the paper's Eq. 1 (matmuls only, 2 FLOPs per
multiply-add, attention score and value matmuls counted in full as the paper does):

    FLOPs = (n_pre + n_rec * r + n_coda) * (24 d^2 + 4 S d) + r * 10 d^2

(dense GPT-2: n_layer * (24 d^2 + 4 S d)). The tied LM head, 2 d V, is reported separately.
Training = 3 x forward; with depth sampling the expected cost uses E[r] (Eq. 1 is linear in r).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rgpt_dist.config.model import GPT2Config, ModelConfig, RecurrentGPTConfig
from rgpt_dist.depth import make_sampler

# Paper Table 1: (Params, FLOPs/fwd) as printed, for the side-by-side check.
PAPER_TABLE1: dict[str, tuple[float, float]] = {
    "gpt2-small": (124e6, 1.84e9),
    "gpt2-medium": (354e6, 7.35e9),
    "gpt2-large": (774e6, 21.1e9),
    "recurrentgpt-small-isoflops": (36e6, 1.84e9),
    "recurrentgpt-medium-isoflops": (124e6, 7.35e9),
    "recurrentgpt-large-isoflops": (288e6, 21.1e9),
    "recurrentgpt-medium-isoparams": (354e6, 26.4e9),
    "recurrentgpt-large-isoparams": (774e6, 109.0e9),
}


def block_params(cfg: ModelConfig) -> int:
    """One GPT-2 block: qkv 3d^2, out d^2, MLP 8d^2; biases 9d and two LayerNorms 4d (2d without bias)."""
    d = cfg.d_model
    return 12 * d * d + (13 * d if cfg.bias else 2 * d)


def recurrence_extra_params(cfg: RecurrentGPTConfig) -> int:
    """W_proj 2d^2 (no bias), gate MLP 2d^2 + d + d^2 + d, two gate LayerNorms."""
    d = cfg.d_model
    return 2 * d * d + (3 * d * d + 2 * d) + (4 * d if cfg.bias else 2 * d)


def embedding_params(cfg: ModelConfig) -> int:
    return cfg.padded_vocab_size * cfg.d_model + cfg.block_size * cfg.d_model


def unique_blocks(cfg: ModelConfig) -> int:
    if isinstance(cfg, RecurrentGPTConfig):
        return cfg.n_pre + cfg.n_rec + cfg.n_coda
    return cfg.n_layer


def param_count(cfg: ModelConfig, embeddings: bool = True) -> int:
    """Unique parameters (tied head counted once); without embeddings drops wte and wpe."""
    final_ln = 2 * cfg.d_model if cfg.bias else cfg.d_model
    n = unique_blocks(cfg) * block_params(cfg) + final_ln
    if isinstance(cfg, RecurrentGPTConfig):
        n += recurrence_extra_params(cfg)
    return n + (embedding_params(cfg) if embeddings else 0)


def block_executions(cfg: ModelConfig, r: float | None = None) -> float:
    """Blocks run per token at depth r (default R)."""
    if isinstance(cfg, RecurrentGPTConfig):
        r = cfg.n_loops if r is None else r
        return cfg.n_pre + cfg.n_rec * r + cfg.n_coda
    return cfg.n_layer


def forward_flops(cfg: ModelConfig, seq_len: int, r: float | None = None) -> float:
    """Eq. 1: forward FLOPs per token without the LM head, at depth r (default R; may be E[r])."""
    d, S = cfg.d_model, seq_len
    flops = block_executions(cfg, r) * (24 * d * d + 4 * S * d)
    if isinstance(cfg, RecurrentGPTConfig):
        flops += (cfg.n_loops if r is None else r) * 10 * d * d
    return float(flops)


def executed_forward_flops(cfg: ModelConfig, seq_len: int, r: float | None = None) -> float:
    """Matmul FLOPs per token (head excluded) this implementation actually runs. RecurrentGPT computes
    the h_pre halves of W_proj and of the gate's first layer once per forward instead of every step,
    so Eq. 1's r * 10 d^2 becomes r * 6 d^2 + 4 d^2 (equal at r = 1; dense models: equal to Eq. 1).
    MFU and the paper's comparisons use Eq. 1; this is the count torch's flop counter sees."""
    if not isinstance(cfg, RecurrentGPTConfig):
        return forward_flops(cfg, seq_len)
    r = cfg.n_loops if r is None else r
    d = cfg.d_model
    return forward_flops(cfg, seq_len, r) - r * 10 * d * d + (r * 6 * d * d + 4 * d * d if r > 0 else 0)


def recompute_flops(cfg: ModelConfig, seq_len: int, r: float | None, mode: str) -> float:
    """Forward FLOPs per token run again in backward by activation checkpointing (`mode` as in
    parallel.activation_checkpointing); hardware utilisation counts them, MFU does not."""
    if mode in ("none", "selective"):  # selective recomputes no matmul
        return 0.0
    block = 24 * cfg.d_model ** 2 + 4 * seq_len * cfg.d_model
    if not isinstance(cfg, RecurrentGPTConfig):
        return float(cfg.n_layer * block)
    r = cfg.n_loops if r is None else r
    d = cfg.d_model
    flops = r * (cfg.n_rec * block + 6 * d * d)  # the recurrence step: core blocks, W_h, gate
    return float(flops + ((cfg.n_pre + cfg.n_coda) * block if mode == "blocks" else 0))


def head_flops(cfg: ModelConfig) -> float:
    """The tied LM head per token, forward: 2 d V (padded vocabulary: the matmul actually run)."""
    return 2.0 * cfg.d_model * cfg.padded_vocab_size


def expected_depth(cfg: ModelConfig) -> float | None:
    """E[r] under the family's training depth sampler (None for dense models)."""
    if isinstance(cfg, RecurrentGPTConfig):
        return make_sampler(cfg.depth_sampler, cfg.r_min, cfg.n_loops).mean()
    return None


def train_flops(cfg: ModelConfig, seq_len: int, r: float | None = None) -> float:
    """Training FLOPs per token (3 x forward, head included) at depth r, default E[r] of the sampler."""
    r = expected_depth(cfg) if r is None else r
    return 3.0 * (forward_flops(cfg, seq_len, r) + head_flops(cfg))


@dataclasses.dataclass
class Solution:
    """An integer layout near a FLOPs target, and its FLOPs ratio to the dense model."""

    value: int
    ratio: float


def solve_isoflops(dense: GPT2Config, n_pre: int, n_coda: int, seq_len: int, *, n_rec: int | None = None,
                   n_loops: int | None = None) -> dict[str, Any]:
    """Given a dense model and a prelude/coda, find R (given n_rec) or n_rec (given R) whose Eq. 1
    forward FLOPs match the dense model's. Returns the exact real solution, the neighbouring
    integers with their FLOPs ratios, and the block-matched value (the paper's convention, which
    ignores the 10 d^2 per-step term)."""
    if (n_rec is None) == (n_loops is None):
        raise ValueError("give exactly one of n_rec and n_loops")
    d, S = dense.d_model, seq_len
    c = 24 * d * d + 4 * S * d
    target = forward_flops(dense, S)
    free = dense.n_layer - n_pre - n_coda
    if free <= 0:
        raise ValueError(f"prelude + coda ({n_pre} + {n_coda}) leave no blocks of the dense {dense.n_layer}")
    if n_rec is not None:  # target = (n_pre + n_coda + n_rec R) c + 10 d^2 R
        exact, blocks, name = free * c / (n_rec * c + 10 * d * d), free / n_rec, "n_loops"
    else:                   # target = (n_pre + n_coda + n_rec R) c + 10 d^2 R, solve for n_rec
        exact, blocks, name = (free * c - 10 * d * d * n_loops) / (n_loops * c), free / n_loops, "n_rec"

    def ratio(v: int) -> float:
        rec = RecurrentGPTConfig(d_model=d, n_head=dense.n_head, vocab_size=dense.vocab_size, n_pre=n_pre,
                                 n_coda=n_coda, n_rec=n_rec if n_rec is not None else v,
                                 n_loops=n_loops if n_loops is not None else v)
        return forward_flops(rec, S) / target

    candidates = sorted({max(1, int(exact)), max(1, int(exact) + 1), max(1, round(blocks))})
    return {"solve": name, "exact": exact, "block_matched": blocks,
            "candidates": [dataclasses.asdict(Solution(v, ratio(v))) for v in candidates]}


def report(name: str, cfg: ModelConfig, seq_len: int, dense: ModelConfig | None) -> dict[str, Any]:
    """One row of `rgpt-flops`: counts, Eq. 1 at R and E[r], ratio to the dense reference, paper columns."""
    row: dict[str, Any] = {
        "name": name, "family": cfg.family,
        "layout": cfg.layout() if isinstance(cfg, RecurrentGPTConfig) else f"{cfg.n_layer}L",
        "params": param_count(cfg), "params_no_embedding": param_count(cfg, embeddings=False),
        "unique_blocks": unique_blocks(cfg), "block_executions": block_executions(cfg),
        "fwd_flops_per_token": forward_flops(cfg, seq_len), "head_flops_per_token": head_flops(cfg),
        "expected_r": expected_depth(cfg), "train_flops_per_token": train_flops(cfg, seq_len),
        "seq_len": seq_len,
    }
    if dense is not None:
        row["fwd_ratio_to_dense"] = row["fwd_flops_per_token"] / forward_flops(dense, seq_len)
        row["train_ratio_to_dense"] = row["train_flops_per_token"] / train_flops(dense, seq_len)
    flags = []
    if name in PAPER_TABLE1:
        p_params, p_flops = PAPER_TABLE1[name]
        row["paper_params"], row["paper_flops_fwd"] = p_params, p_flops
        row["params_vs_paper"] = row["params"] / p_params
        if abs(row["params_vs_paper"] - 1) > 0.02:
            flags.append(f"params {row['params'] / 1e6:.1f}M vs paper {p_params / 1e6:.0f}M")
        ours = row["fwd_flops_per_token"] + row["head_flops_per_token"]
        row["paper_flops_fwd_vs_ours"] = p_flops / ours
        flags.append(f"paper FLOPs/fwd {p_flops / 1e9:.3g}G is {p_flops / ours:.2f}x our Eq. 1 forward "
                     f"incl. head ({ours / 1e9:.3g} GFLOPs/token at S={seq_len}); the paper states no unit")
        if dense is not None and PAPER_TABLE1.get(_dense_name(dense)):
            paper_ratio = p_flops / PAPER_TABLE1[_dense_name(dense)][1]
            row["paper_fwd_ratio_to_dense"] = paper_ratio
            if abs(row["fwd_ratio_to_dense"] / paper_ratio - 1) > 0.02:
                flags.append(f"fwd FLOPs ratio to dense {row['fwd_ratio_to_dense']:.3f} vs paper {paper_ratio:.3f}")
    row["flags"] = flags
    return row


def _dense_name(cfg: ModelConfig) -> str | None:
    """The paper flavour name of a dense config, matched by width and depth."""
    from rgpt_dist.config.flavours import FLAVOURS

    for name, data in FLAVOURS.items():
        if (data["family"] == "gpt2" and name in PAPER_TABLE1 and data["d_model"] == cfg.d_model
                and data["n_layer"] == getattr(cfg, "n_layer", None)):
            return name
    return None


def total_train_flops(cfg: ModelConfig, seq_len: int, steps: int, tokens_per_step: int) -> float:
    """Training FLOPs of a whole run: train_flops (3 x Eq. 1 forward at E[r], head included) per token
    x tokens_per_step x steps. Activation-checkpointing recomputation is not included (as in MFU)."""
    if steps < 0 or tokens_per_step <= 0:
        raise ValueError(f"steps={steps} must be >= 0 and tokens_per_step={tokens_per_step} > 0")
    return train_flops(cfg, seq_len) * tokens_per_step * steps


def gpu_hours(cfg: ModelConfig, seq_len: int, steps: int, tokens_per_step: int, peak_flops_per_gpu: float,
              mfu: float) -> float:
    """Estimated GPU-hours of a run: total_train_flops / (peak_flops_per_gpu x mfu) / 3600.

    `mfu` is the model FLOPs utilisation assumed (0 < mfu <= 1), in the trainer's own sense (Eq. 1
    FLOPs of the depth run, recomputation not counted); `peak_flops_per_gpu` e.g. 989e12 (H100/H200
    dense bf16). Evaluation, checkpointing, start-up and restarts are not included."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu={mfu} must be in (0, 1]")
    if peak_flops_per_gpu <= 0:
        raise ValueError(f"peak_flops_per_gpu={peak_flops_per_gpu} must be > 0")
    return total_train_flops(cfg, seq_len, steps, tokens_per_step) / (peak_flops_per_gpu * mfu) / 3600.0
