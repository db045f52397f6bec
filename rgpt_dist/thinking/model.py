"""The silent-thinking depth-recurrent classifier (SPEC section 8; the first abstract of
shared/papers/related_abstracts.txt) and its fixed-depth baseline. Plain PyTorch, no process groups.

Shapes: B examples, T positions, d = d_model, H heads of hd = d / H, K readout positions, S steps.

    h_0 = Dropout(LN(E_tok[tokens] + E_role[roles]))                  [B, T, d]
    step t = 0 .. S - 1 (one shared block):
        h_hat = h + depth_emb[t]
        h'    = h_hat + gamma1 * Attn(LN1 h_hat)        bidirectional, under the input's mask
        h'    = h'    + gamma2 * FFN(LN2 h')
        z     = sigmoid(W_z [h'; h] + b_z)               b_z initialised to gate_bias (-2)
        h     = z * h' + (1 - z) * h
    logit = Head([h_S[readout_1]; ...; h_S[readout_K]])                 [B]
    Head  = LayerNorm(K d) -> Linear(K d, d) -> GELU -> Dropout -> Linear(d, 1)

gamma1, gamma2 are per-channel LayerScale gains initialised to cfg.layerscale, or 1 (no parameter)
without LayerScale. Attention sees the input's `attn_mask` [B, T, T] (True: query i may attend key j;
the graph's adjacency plus self-loops) when given, else every non-padding key (each position also
keeps itself, so an all-padding row cannot make softmax NaN; padding states are never read). With
positions=rope, q and k are rotated at their index (rgpt_dist.models.layers.rope_rotate, the
authors' rotate-half form). Nothing in step t depends on the total S, so the logits read after step s
of a longer run equal those of an s-step run (`forward(..., all_steps=True)`).

Choices where the authors' three scripts differ (docs/thinking.md): the graph task's block is
torch's nn.TransformerEncoderLayer (ReLU FFN, one more dropout on the attention output), the sequence
tasks' a custom block (exact GELU, dropout on the attention weights, the FFN's hidden and output);
here one block serves all three with the FFN's activation from the config (`activation`) and the
sequence tasks' dropout sites. Initialisation is torch's default for every Linear (the sequence
tasks' code; cfg.attn_init="mha" gives the attention the graph code's nn.MultiheadAttention init
instead: xavier-uniform q/k/v weight, zero biases), N(0, 1) for the token and depth embeddings
(nn.Embedding's, as theirs; padding row zero) and N(0, 0.02) for the role vectors. The project's
layers.MLP (tanh GELU, no inner dropout, GPT-2's normal init through a LayerFactory) and
CausalSelfAttention (causal or a padding mask built for decoding) do not fit these blocks; its rotary
helper does.
"""
from __future__ import annotations

import numbers
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from rgpt_dist.models.layers import rope_rotate
from rgpt_dist.thinking.config import ThinkingModelConfig
from rgpt_dist.thinking.inputs import ThinkingInputs

PAD_ID = 0
"""The padding token id (ThinkingInputs' contract): its embedding row is zero and, without an
attention mask, no query attends to it."""


class Attention(nn.Module):
    """Bidirectional multi-head attention under a boolean mask. qkv's output features are [q; k; v],
    each [H, hd] (rows 0..d-1 are q's, d..2d-1 k's, 2d..3d-1 v's)."""

    def __init__(self, cfg: ThinkingModelConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)                 # W [3d, d], b [3d]
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        if cfg.attn_init == "mha":
            # nn.MultiheadAttention's _reset_parameters (the graph task's block): xavier-uniform over the
            # stacked [3d, d] in-projection (fan_in d, fan_out 3d), zero in- and output biases; the output
            # weight keeps nn.Linear's init. "linear" touches nothing (and draws nothing more).
            nn.init.xavier_uniform_(self.qkv.weight)
            nn.init.zeros_(self.qkv.bias)
            nn.init.zeros_(self.proj.bias)
        self.dropout = cfg.dropout
        self.rope_base = cfg.rope_base if cfg.positions == "rope" else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, T, d], mask [B, 1, T, T] bool (True: attend) -> [B, T, d]."""
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)  # each [B, H, T, hd]
        if self.rope_base is not None:
            pos = torch.arange(T, device=x.device)
            q, k = rope_rotate(q, pos, self.rope_base), rope_rotate(k, pos, self.rope_base)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)  # [B, H, T, hd]
        return self.proj(y.transpose(1, 2).reshape(B, T, d))


class FeedForward(nn.Module):
    """d -> d_ff -> d with the config's activation (exact GELU or ReLU), dropout after the activation
    and after the output projection (the authors' sequence-task FFN)."""

    def __init__(self, cfg: ThinkingModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.proj = nn.Linear(cfg.d_ff, cfg.d_model)
        self.act = nn.GELU() if cfg.activation == "gelu" else nn.ReLU()
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.drop(self.act(self.fc(x)))))


class Residual(nn.Module):
    """The pre-norm residual pair: x + gamma1 * Attn(LN1 x), then + gamma2 * FFN(LN2 .). gamma1, gamma2
    are per-channel [d] gains initialised to `layerscale`, or absent (gain 1) when it is None."""

    def __init__(self, cfg: ThinkingModelConfig, layerscale: float | None):
        super().__init__()
        d = cfg.d_model
        self.ln_1, self.attn = nn.LayerNorm(d, eps=cfg.ln_eps), Attention(cfg)
        self.ln_2, self.ffn = nn.LayerNorm(d, eps=cfg.ln_eps), FeedForward(cfg)
        if layerscale:
            self.gamma1 = nn.Parameter(torch.full((d,), float(layerscale)))
            self.gamma2 = nn.Parameter(torch.full((d,), float(layerscale)))
        else:
            self.gamma1 = self.gamma2 = None

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, T, d] -> [B, T, d]."""
        a = self.attn(self.ln_1(x), mask)
        x = x + (a if self.gamma1 is None else self.gamma1 * a)
        f = self.ffn(self.ln_2(x))
        return x + (f if self.gamma2 is None else self.gamma2 * f)


class RoleEmbedding(nn.Module):
    """Role r >= 1 adds row r - 1 of `weight` [n_roles, d] (the authors' source and target vectors,
    N(0, 0.02)); role 0 adds nothing. A module of its own, not a bare parameter of the model: ZeRO-3
    gathers a parameter for the forward and backward of the module that owns it when that module is
    called."""

    def __init__(self, n_roles: int, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_roles, d) * 0.02)                   # [n_roles, d]

    def forward(self, roles: torch.Tensor) -> torch.Tensor:
        """roles [B, T] in 0..n_roles -> [B, T, d]."""
        table = torch.cat([self.weight.new_zeros(1, self.weight.shape[1]), self.weight])  # [n_roles + 1, d]
        return table[roles]


class ThinkingBlock(nn.Module):
    """The shared block of one thinking step: depth embedding, Residual, identity-biased gate."""

    def __init__(self, cfg: ThinkingModelConfig):
        super().__init__()
        d = cfg.d_model
        self.depth_emb = nn.Embedding(cfg.max_steps, d)            # [max_steps, d], N(0, 1) as nn.Embedding
        self.residual = Residual(cfg, cfg.gains)
        self.gate_proj = nn.Linear(2 * d, d)                         # W_z [d, 2d], b_z [d]
        nn.init.constant_(self.gate_proj.bias, cfg.gate_bias)

    def gate(self, h_new: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """z = sigmoid(W_z [h'; h] + b_z): [B, T, d] each -> [B, T, d]."""
        return torch.sigmoid(self.gate_proj(torch.cat([h_new, h], dim=-1)))

    def forward(self, h: torch.Tensor, t: int, mask: torch.Tensor) -> torch.Tensor:
        """Step t (0-based) on h [B, T, d] under mask [B, 1, T, T] -> the next h [B, T, d]."""
        # the row through the module's own call: ZeRO-3 gathers a module's parameters when it is called
        row = self.depth_emb(torch.full((), t, dtype=torch.long, device=h.device))  # [d]
        h_new = self.residual(h + row, mask)                         # h' from h_hat = h + depth_emb[t]
        z = self.gate(h_new, h)
        return z * h_new + (1 - z) * h


class ThinkingModel(nn.Module):
    """Embedding, `steps` applications of one ThinkingBlock, readout head (module docstring)."""

    recurrent = True
    """Takes a number of thinking steps (the fixed-depth baseline does not)."""

    def __init__(self, cfg: ThinkingModelConfig, factory: Any = None):
        """factory: accepted for the trainer's build(cfg, factory) call; only an unsharded one (tp_size
        1): these models are small and have no tensor-parallel layers."""
        super().__init__()
        cfg.check()
        if getattr(factory, "tp_size", 1) != 1:
            raise ValueError(f"the thinking model has no tensor-parallel layers: parallel.tp_size="
                             f"{factory.tp_size} must be 1")
        self.cfg = cfg
        d = cfg.d_model
        self.tok_emb = nn.Embedding(cfg.vocab_size, d, padding_idx=PAD_ID)     # [V, d], row 0 zero
        # role r >= 1 adds row r - 1 (the authors' source and target vectors, N(0, 0.02)); role 0 nothing
        self.role_emb = RoleEmbedding(cfg.n_roles, d) if cfg.n_roles else None
        self.emb_norm, self.emb_drop = nn.LayerNorm(d, eps=cfg.ln_eps), nn.Dropout(cfg.dropout)
        self.core = self._core(cfg)
        k = cfg.readout_k * d
        self.head = nn.Sequential(nn.LayerNorm(k, eps=cfg.ln_eps), nn.Linear(k, d), nn.GELU(),
                                  nn.Dropout(cfg.dropout), nn.Linear(d, 1))

    def _core(self, cfg: ThinkingModelConfig) -> nn.Module:
        return ThinkingBlock(cfg)

    def checkpoint_units(self, mode: str) -> list[nn.Module]:
        """What activation checkpointing recomputes (rgpt_dist.parallel.checkpointing): the shared
        block, once per thinking step, in every mode (the model has no prelude or coda)."""
        return [self.core]

    # -- the pieces, in the order a forward runs them ---------------------------------------------
    def check_inputs(self, x: ThinkingInputs) -> None:
        """ValueError naming the offending input before any work (shapes, dtypes, id ranges)."""
        cfg, tokens = self.cfg, x.tokens
        if tokens.dim() != 2 or tokens.dtype != torch.int64 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be a non-empty [B, T] int64 tensor, got {tuple(tokens.shape)} {tokens.dtype}")
        B, T = tokens.shape
        if x.readout.shape != (B, cfg.readout_k):
            raise ValueError(f"readout has shape {tuple(x.readout.shape)}, expected [B, readout_k] = [{B}, {cfg.readout_k}]")
        if (x.roles is None) != (self.role_emb is None):
            raise ValueError(f"roles {'missing' if x.roles is None else 'given'} but model.n_roles={cfg.n_roles}")
        if x.roles is not None and x.roles.shape != (B, T):
            raise ValueError(f"roles has shape {tuple(x.roles.shape)}, expected tokens' {(B, T)}")
        if x.attn_mask is not None and (x.attn_mask.shape != (B, T, T) or x.attn_mask.dtype != torch.bool):
            raise ValueError(f"attn_mask must be a [B, T, T] = {[B, T, T]} bool tensor, got "
                             f"{tuple(x.attn_mask.shape)} {x.attn_mask.dtype}")
        ranges = [(name, ids, limit) for name, ids, limit in (("tokens", tokens, cfg.vocab_size),
                  ("readout", x.readout, T), ("roles", x.roles, cfg.n_roles + 1)) if ids is not None and ids.numel()]
        bad = [((ids < 0) | (ids >= limit)).any() for _, ids, limit in ranges]
        if x.attn_mask is not None:
            bad.append(~x.attn_mask.any(-1).all())
        if not bool(torch.stack(bad).any()):  # one device sync for every value check
            return
        for name, ids, limit in ranges:
            if int(ids.min()) < 0 or int(ids.max()) >= limit:
                raise ValueError(f"{name} ids must be in [0, {limit}), got [{int(ids.min())}, {int(ids.max())}]")
        raise ValueError("attn_mask has a query row with no key (the contract keeps i -> i on every position)")

    def check_steps(self, steps: int) -> None:
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or not 1 <= steps <= self.cfg.max_steps:
            raise ValueError(f"steps={steps!r} must be an integer in [1, max_steps={self.cfg.max_steps}] "
                             f"(the depth embedding has max_steps rows)")

    def embed(self, x: ThinkingInputs) -> torch.Tensor:
        """h_0 = Dropout(LN(E_tok[tokens] + E_role[roles])): [B, T] ids -> [B, T, d]."""
        h = self.tok_emb(x.tokens)
        if self.role_emb is not None:
            h = h + self.role_emb(x.roles)
        return self.emb_drop(self.emb_norm(h))

    def attention_mask(self, x: ThinkingInputs) -> torch.Tensor:
        """[B, 1, T, T] bool: the input's attn_mask, else non-padding keys plus each position itself."""
        if x.attn_mask is not None:
            return x.attn_mask[:, None]
        T = x.tokens.shape[1]
        keep = (x.tokens != PAD_ID)[:, None, None, :]                                    # [B, 1, 1, T]
        return keep | torch.eye(T, dtype=torch.bool, device=x.tokens.device)[None, None]  # [B, 1, T, T]

    def readout(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """h [B, T, d], positions [B, K] -> logits [B]: the head on [h[p_1]; ...; h[p_K]] [B, K d]."""
        B, _, d = h.shape
        picked = h.gather(1, positions[..., None].expand(-1, -1, d))                     # [B, K, d]
        return self.head(picked.reshape(B, -1)).squeeze(-1)                              # [B]

    # -- the whole model ----------------------------------------------------------------------
    def forward(self, x: ThinkingInputs, steps: int | None = None, all_steps: bool = False) -> torch.Tensor:
        """`logits` (the trainer's subclass, rgpt_dist.thinking.trainable, replaces this call)."""
        return self.logits(x, steps, all_steps)

    def logits(self, x: ThinkingInputs, steps: int, all_steps: bool = False) -> torch.Tensor:
        """Logits [B] after `steps` thinking steps, or [steps, B] (the readout after every step, row
        s - 1 being what an s-step run returns) with all_steps."""
        self.check_steps(steps)
        self.check_inputs(x)
        h, mask = self.embed(x), self.attention_mask(x)
        per_step = []
        for t in range(steps):
            h = self.core(h, t, mask)                                                     # [B, T, d]
            if all_steps:
                per_step.append(self.readout(h, x.readout))
        return torch.stack(per_step) if all_steps else self.readout(h, x.readout)

    def loss(self, x: ThinkingInputs, steps: int, alpha: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(thinking_loss, final logits [B]) with alpha (cfg.supervision_alpha when None); alpha 0
        runs one readout (the final step's) only."""
        alpha = self.cfg.supervision_alpha if alpha is None else alpha
        check_alpha(alpha)
        logits = self.logits(x, steps, all_steps=alpha > 0)
        return thinking_loss(logits, x.labels, alpha), (logits[-1] if alpha > 0 else logits)


class FixedDepthModel(ThinkingModel):
    """The authors' fixed-depth baseline: the same embedding and head around `n_layers` distinct
    Residual blocks (no sharing, no gate, no depth embedding, no LayerScale), one forward pass."""

    recurrent = False

    def __init__(self, cfg: ThinkingModelConfig, n_layers: int, factory: Any = None):
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or not 1 <= n_layers <= 1024:
            raise ValueError(f"n_layers={n_layers!r} must be an integer in [1, 1024]")
        self.n_layers = n_layers  # read by _core during ThinkingModel.__init__ (a plain int: allowed first)
        super().__init__(cfg, factory)

    def _core(self, cfg: ThinkingModelConfig) -> nn.Module:
        return nn.ModuleList(Residual(cfg, None) for _ in range(self.n_layers))

    def checkpoint_units(self, mode: str) -> list[nn.Module]:
        return list(self.core)  # each block

    def logits(self, x: ThinkingInputs, steps: int | None = None, all_steps: bool = False) -> torch.Tensor:
        """Logits [B] after the n_layers blocks; `steps` is ignored (the depth is fixed) and all_steps
        gives [1, B] (one readout: there are no intermediate steps to supervise)."""
        self.check_inputs(x)
        h, mask = self.embed(x), self.attention_mask(x)
        for block in self.core:
            h = block(h, mask)
        logits = self.readout(h, x.readout)
        return logits[None] if all_steps else logits


def check_alpha(alpha: float) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha={alpha!r} must be a number in [0, 1]")


def thinking_loss(logits: torch.Tensor, labels: torch.Tensor, alpha: float) -> torch.Tensor:
    """(1 - alpha) BCE(final) + alpha mean_t BCE_t, each BCE with logits averaged over the batch.

    logits: [S, B] (every step's readout; row -1 is the final step) or [B] (the final step only,
    enough for alpha = 0); labels [B] (0/1, any dtype). alpha = 0 reads the final row only, so no
    intermediate readout is needed (nor any gradient through one)."""
    check_alpha(alpha)
    if logits.dim() == 1:
        if alpha > 0:
            raise ValueError(f"alpha={alpha} needs every step's logits [S, B], got the final step's only [B]")
        logits = logits[None]
    if logits.dim() != 2 or logits.shape[1] != labels.shape[0] or labels.dim() != 1:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} must be [S, B] and [B]")
    target = labels.to(logits.dtype)
    final = F.binary_cross_entropy_with_logits(logits[-1], target)
    if alpha == 0:
        return final
    per_step = F.binary_cross_entropy_with_logits(logits, target.expand_as(logits), reduction="none").mean(-1)  # [S]
    return (1 - alpha) * final + alpha * per_step.mean()


def build(cfg: ThinkingModelConfig, baseline_layers: int | None = None) -> ThinkingModel:
    """The thinking model, or with baseline_layers the fixed-depth baseline of that many blocks."""
    return ThinkingModel(cfg) if baseline_layers is None else FixedDepthModel(cfg, baseline_layers)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = ["PAD_ID", "ThinkingModel", "FixedDepthModel", "ThinkingBlock", "Residual", "Attention", "FeedForward",
           "thinking_loss", "check_alpha", "build", "count_parameters"]
