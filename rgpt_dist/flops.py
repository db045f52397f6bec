"""Parameters and FLOPs per family: the single source for `rgpt-flops`, MFU and grid cost estimates.

Forward FLOPs per token at sequence length S follow the paper's Eq. 1 (matmuls only, 2 FLOPs per
multiply-add, attention score and value matmuls counted in full as the paper does):

    FLOPs = (n_pre + n_rec * r + n_coda) * (24 d^2 + 4 S d) + r * 10 d^2

(dense GPT-2: n_layer * (24 d^2 + 4 S d)). A block's 24 d^2 is 8 d^2 (qkv, out) + 2 k d d_ff for an
MLP of k matrices (gelu 2, swiglu 3) of width d_ff (4 d by default: 16 d^2). The tied LM head, 2 d V, is reported separately. Every
family-specific term comes from the family's spec (rgpt_dist.models.spec): blocks run at depth r,
its per-step extras (RecurrentGPT's 10 d^2 above, an adapter, LoRA), its extra parameters, what
truncated backprop runs without autograd and what checkpointing recomputes.
Training = 3 x forward, less 2 x the no-grad forward; with depth sampling, the expectation over the
sampler's distribution.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from rgpt_dist.models.config import LoopedConfig, ModelConfig
from rgpt_dist.models.spec import block_flops, families, spec_for
from rgpt_dist.models.flavours import FLAVOURS


def paper_table1() -> dict[str, tuple[float, float]]:
    """Paper Table 1: flavour -> (Params, FLOPs/fwd) as printed, for the side-by-side check."""
    return {k: v for spec in families().values() for k, v in spec.paper_table1.items()}


def norm_params(cfg: ModelConfig) -> int:
    """One normalisation over d: LayerNorm 2d (d without bias), RMSNorm d (a gain only)."""
    return 2 * cfg.d_model if cfg.bias and cfg.norm == "layernorm" else cfg.d_model


def block_params(cfg: ModelConfig) -> int:
    """One block: qkv 3d^2, out d^2, MLP 2 d d_ff (gelu) or 3 d d_ff (swiglu), with biases 4d +
    d_ff + d (gelu) or 2 d_ff + d (swiglu); two norms (norm_params); QK-norm's two head_dim gains.
    GPT-2 (d_ff = 4d, biases, LayerNorm): 12 d^2 + 13 d."""
    d, f = cfg.d_model, cfg.ffn_width
    k = 3 if cfg.mlp == "swiglu" else 2
    biases = 4 * d + (k - 1) * f + d if cfg.bias else 0
    return 4 * d * d + k * d * f + biases + 2 * norm_params(cfg) + (2 * cfg.head_dim if cfg.qk_norm else 0)


def embedding_params(cfg: ModelConfig) -> int:
    wpe = cfg.block_size * cfg.d_model if getattr(cfg, "pos_encoding", "learned") == "learned" else 0  # rope/alibi/none: none
    return cfg.padded_vocab_size * cfg.d_model + wpe + spec_for(cfg).head_params(cfg)  # + an untied head


def unique_blocks(cfg: ModelConfig) -> int:
    return spec_for(cfg).unique_blocks(cfg)


def param_count(cfg: ModelConfig, embeddings: bool = True) -> int:
    """Unique parameters (tied head counted once); without embeddings drops wte and wpe."""
    n = unique_blocks(cfg) * block_params(cfg) + norm_params(cfg) + spec_for(cfg).extra_params(cfg)
    return n + (embedding_params(cfg) if embeddings else 0)


def param_split(cfg: ModelConfig) -> tuple[int, int]:
    """(N_once, N_rec) of the looped scaling law (SPEC section 10), non-embedding: N_rec is the shared
    core's blocks (spec.recurrent_blocks) plus what runs at every step with shared weights
    (spec.step_params: RecurrentGPT's W_proj and gate, Poisson's adapter); N_once the rest (prelude,
    coda, final norm, per-step-unshared extras). N_once + N_rec == param_count(cfg, embeddings=False)."""
    spec = spec_for(cfg)
    n_rec = spec.recurrent_blocks(cfg) * block_params(cfg) + spec.step_params(cfg)
    return param_count(cfg, embeddings=False) - n_rec, n_rec


def block_executions(cfg: ModelConfig, r: float | None = None) -> float:
    """Blocks run per token at depth r (default R)."""
    return spec_for(cfg).block_executions(cfg, r)


def forward_flops(cfg: ModelConfig, seq_len: int, r: float | None = None) -> float:
    """Eq. 1: forward FLOPs per token without the LM head, at depth r (default R; may be E[r])."""
    return spec_for(cfg).forward_flops(cfg, seq_len, r)


def executed_forward_flops(cfg: ModelConfig, seq_len: int, r: float | None = None) -> float:
    """Matmul FLOPs per token (head excluded) this implementation actually runs, e.g. RecurrentGPT
    computes the h_pre halves of W_proj and of the gate once per forward instead of every step.
    MFU and the paper's comparisons use Eq. 1; this is the count torch's flop counter sees."""
    spec = spec_for(cfg)
    return float(block_executions(cfg, r) * block_flops(cfg, seq_len) + spec.executed_step_flops(cfg, r)
                 + spec.executed_sequence_flops(cfg, seq_len, r))


def executed_overhead_flops(cfg: ModelConfig, r: float | None = None) -> float:
    """Matmul FLOPs a forward runs once whatever its token count (RRT's merged LoRA weights)."""
    return float(spec_for(cfg).executed_overhead_flops(cfg, r))


def recompute_flops(cfg: ModelConfig, seq_len: int, r: float | None, mode: str) -> float:
    """Forward FLOPs per token run again in backward by activation checkpointing (`mode` as in
    parallel.activation_checkpointing); hardware utilisation counts them, MFU does not."""
    if mode in ("none", "selective"):  # selective recomputes no matmul
        return 0.0
    return float(spec_for(cfg).recompute_flops(cfg, seq_len, r, mode))


def head_flops(cfg: ModelConfig) -> float:
    """The output head per token, forward (FamilySpec.head_flops: an LM head's 2 d V, padded
    vocabulary: the matmul actually run)."""
    return float(spec_for(cfg).head_flops(cfg))


def expected_depth(cfg: ModelConfig) -> float | None:
    """E[r] under the family's training depth sampler (None for families without a depth)."""
    sampler = spec_for(cfg).depth_sampler(cfg)
    return None if sampler is None else sampler.mean()


def train_flops(cfg: ModelConfig, seq_len: int, r: float | None = None) -> float:
    """Training FLOPs per token at depth r (head included): 3 x forward, plus 3 x the readouts
    training adds (Ouro's every iteration), less the backward of the steps truncated backprop runs
    without autograd. r=None: the expectation over the family's
    depth sampler (E[r] itself where that is linear)."""
    spec = spec_for(cfg)
    if r is None:
        sampler = spec.depth_sampler(cfg)
        if sampler is not None:
            return sum(p * train_flops(cfg, seq_len, k) for k, p in sampler.pmf().items())
    full = 3.0 * (forward_flops(cfg, seq_len, r) + head_flops(cfg))
    if r is None:
        return full
    return full + 3.0 * spec.train_readout_flops(cfg, seq_len, r) - 2.0 * spec.no_grad_forward_flops(cfg, seq_len, r)


@dataclasses.dataclass
class Solution:
    """An integer layout near a FLOPs target, and its FLOPs ratio to the dense model."""

    value: int
    ratio: float


def _check_sizes(**sizes: tuple[Any, int]) -> None:
    """ValueError naming every size that is not an integer >= its minimum (None: not given): a zero
    divides by zero in the solver, a negative gives a meaningless negative FLOPs count."""
    bad = [f"{name}={value!r} must be an integer >= {low}" for name, (value, low) in sizes.items()
           if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low)]
    if bad:
        raise ValueError("; ".join(bad))


def solve_isoflops(dense: ModelConfig, n_pre: int, n_coda: int, seq_len: int, *, n_rec: int | None = None,
                   n_loops: int | None = None, family: str = "recurrent_gpt") -> dict[str, Any]:
    """Given a dense model and a prelude/coda, find R (given n_rec) or n_rec (given R) whose Eq. 1
    forward FLOPs for a looped `family` match the dense model's. Returns the exact real solution,
    the neighbouring integers with their FLOPs ratios, and the block-matched value (the paper's
    convention, which ignores the family's per-step term, e.g. RecurrentGPT's 10 d^2)."""
    if (n_rec is None) == (n_loops is None):
        raise ValueError("give exactly one of n_rec and n_loops")
    _check_sizes(seq_len=(seq_len, 1), n_pre=(n_pre, 0), n_coda=(n_coda, 0), n_rec=(n_rec, 1), n_loops=(n_loops, 1))
    spec = spec_for(family)
    if not issubclass(spec.config, LoopedConfig) or spec_for(dense).recurrent:
        raise ValueError(f"solve_isoflops matches a looped family ({family}) to a dense model ({dense.family})")
    d, S = dense.d_model, seq_len
    c = block_flops(dense, S)
    target = forward_flops(dense, S)
    free = dense.n_layer - n_pre - n_coda
    if free <= 0:
        raise ValueError(f"prelude + coda ({n_pre} + {n_coda}) leave no blocks of the dense {dense.n_layer}")

    def looped_cfg(rec: int, loops: int) -> LoopedConfig:
        return spec.config(d_model=d, n_head=dense.n_head, vocab_size=dense.vocab_size, n_pre=n_pre,
                           n_coda=n_coda, n_rec=rec, n_loops=loops)

    e = spec.step_flops(looped_cfg(1, 1), 1)  # per-step term: target = (n_pre + n_coda + n_rec R) c + e R
    if n_rec is not None:
        exact, blocks, name = free * c / (n_rec * c + e), free / n_rec, "n_loops"
    else:
        exact, blocks, name = (free * c - e * n_loops) / (n_loops * c), free / n_loops, "n_rec"

    def ratio(v: int) -> float:
        return forward_flops(looped_cfg(n_rec or v, n_loops or v), S) / target

    candidates = sorted({max(1, int(exact)), max(1, int(exact) + 1), max(1, round(blocks))})
    return {"solve": name, "exact": exact, "block_matched": blocks,
            "candidates": [dataclasses.asdict(Solution(v, ratio(v))) for v in candidates]}


def report(name: str, cfg: ModelConfig, seq_len: int, dense: ModelConfig | None) -> dict[str, Any]:
    """One row of `rgpt-flops`: counts, Eq. 1 at R and E[r], ratio to the dense reference, paper columns."""
    _check_sizes(seq_len=(seq_len, 1))
    row: dict[str, Any] = {
        "name": name, "family": cfg.family,
        "layout": spec_for(cfg).layout(cfg),
        "params": param_count(cfg), "params_no_embedding": param_count(cfg, embeddings=False),
        "params_once": param_split(cfg)[0], "params_rec": param_split(cfg)[1],
        "unique_blocks": unique_blocks(cfg), "block_executions": block_executions(cfg),
        "fwd_flops_per_token": forward_flops(cfg, seq_len), "head_flops_per_token": head_flops(cfg),
        "expected_r": expected_depth(cfg), "train_flops_per_token": train_flops(cfg, seq_len),
        "seq_len": seq_len,
    }
    flags = []
    if dense is not None:
        row["fwd_ratio_to_dense"] = row["fwd_flops_per_token"] / forward_flops(dense, seq_len)
        row["train_ratio_to_dense"] = row["train_flops_per_token"] / train_flops(dense, seq_len)
        flags += compute_flags(row["fwd_ratio_to_dense"], row["train_ratio_to_dense"])
    spec, table = spec_for(cfg), paper_table1()
    parts = spec.param_breakdown(cfg)  # reported apart, e.g. RRT's LoRA ("+LoRA" in Table 1)
    row.update({f"params_{part}": n for part, n in parts.items()})
    if name in table:
        p_params, p_flops = table[name]
        comparable = row["params"] - sum(parts.values()) if spec.paper_params_note else row["params"]
        row["paper_params"], row["paper_flops_fwd"] = p_params, p_flops
        row["paper_params_note"] = spec.paper_params_note or None
        row["params_vs_paper"] = comparable / p_params
        if abs(row["params_vs_paper"] - 1) > 0.02:
            flags.append(f"params {comparable / 1e6:.1f}M vs paper {p_params / 1e6:.0f}M")
        if spec.paper_params_note:
            flags.append(f"paper params {p_params / 1e6:.0f}M {spec.paper_params_note}: ours "
                         + ", ".join(f"{part} {n / 1e6:.1f}M" for part, n in parts.items()) + " on top")
        ours = row["fwd_flops_per_token"] + row["head_flops_per_token"]
        row["paper_flops_fwd_vs_ours"] = p_flops / ours
        flags.append(f"paper FLOPs/fwd {p_flops / 1e9:.3g}G is {p_flops / ours:.2f}x our Eq. 1 forward "
                     f"incl. head ({ours / 1e9:.3g} GFLOPs/token at S={seq_len}); the paper states no unit")
        if dense is not None and table.get(_dense_name(dense)):
            paper_ratio = p_flops / table[_dense_name(dense)][1]
            row["paper_fwd_ratio_to_dense"] = paper_ratio
            if abs(row["fwd_ratio_to_dense"] / paper_ratio - 1) > 0.02:
                flags.append(f"fwd FLOPs ratio to dense {row['fwd_ratio_to_dense']:.3f} vs paper {paper_ratio:.3f}")
    row["flags"] = flags
    return row


COMPUTE_TOLERANCE = 0.05
"""A row whose forward or training FLOPs per token differ from its cell's dense model by more than
this is flagged (`rgpt-flops`, `rgpt-eval grid`): the comparison is then not at equal compute."""


def compute_flags(fwd_ratio: float | None, train_ratio: float | None) -> list[str]:
    """The flags of a row's FLOPs per token relative to its dense model (forward at R, training at
    E[r] with what training adds, e.g. Ouro's every-iteration readout)."""
    return [f"{what} FLOPs/token {ratio:.2f}x the dense model's" for what, ratio in
            (("forward", fwd_ratio), ("training", train_ratio))
            if ratio is not None and abs(ratio - 1) > COMPUTE_TOLERANCE]


def _dense_name(cfg: ModelConfig) -> str | None:
    """The paper flavour name of a dense config, matched by width and depth."""

    for name, data in FLAVOURS.items():
        if name in paper_table1() and all(getattr(cfg, k, None) == v for k, v in data.items()):
            return name
    return None


def total_train_flops(cfg: ModelConfig, seq_len: int, steps: int, tokens_per_step: int) -> float:
    """Training FLOPs of a whole run: train_flops (3 x Eq. 1 forward at E[r], head included) per token
    x tokens_per_step x steps. Activation-checkpointing recomputation is not included (as in MFU)."""
    if steps < 0 or tokens_per_step <= 0:
        raise ValueError(f"steps={steps} must be >= 0 and tokens_per_step={tokens_per_step} > 0")
    _check_sizes(seq_len=(seq_len, 1))
    return train_flops(cfg, seq_len) * tokens_per_step * steps


def gpu_hours(cfg: ModelConfig, seq_len: int, steps: int, tokens_per_step: int, peak_flops_per_gpu: float,
              mfu: float) -> float:
    """Estimated GPU-hours of a run: total_train_flops / (peak_flops_per_gpu x mfu) / 3600.

    `mfu` is the model FLOPs utilisation assumed (0 < mfu <= 1), in the trainer's own sense (Eq. 1
    FLOPs of the depth run, recomputation not counted); `peak_flops_per_gpu` e.g. 989e12 (H100/H200
    dense bf16). Evaluation, checkpointing, start-up and restarts are not included."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu={mfu} must be in (0, 1]")
    if not 0 < peak_flops_per_gpu < math.inf:
        raise ValueError(f"peak_flops_per_gpu={peak_flops_per_gpu} must be a finite number > 0")
    return total_train_flops(cfg, seq_len, steps, tokens_per_step) / (peak_flops_per_gpu * mfu) / 3600.0


def cached_layers(cfg: ModelConfig, strategy: str, r: int | None) -> int:
    """Attention layers holding K/V for depth r under `strategy`, as the family's spec counts them
    (GPT-2: n_layer; prelude/core/coda families: n_pre + n_coda + n_rec x (r if full else 1))."""
    from rgpt_dist.models.kv_cache import STRATEGIES  # (imports torch: only KV-cache sizing needs it)

    if strategy not in STRATEGIES:
        raise ValueError(f"unknown KV-cache strategy {strategy!r}; expected one of {STRATEGIES}")
    return spec_for(cfg).cached_layers(cfg, strategy, r)


def kv_cache_bytes(cfg: ModelConfig, batch: int, seq_len: int, strategy: str = "full", r: int | None = None,
                   dtype_bytes: int = 2) -> int:
    """Analytic K/V cache size for `seq_len` cached tokens: cached_layers x 2 (K and V) x batch x
    seq_len x d_model x dtype_bytes (bf16: 2). d_model is the full width: one tensor-parallel shard
    holds 1/tp of it (its local heads), so divide by tp per rank."""
    return cached_layers(cfg, strategy, r) * 2 * batch * seq_len * cfg.d_model * dtype_bytes
