"""RecurrentGPT for Hugging Face `transformers` (`trust_remote_code=True`): inference only.

Self-contained (torch, transformers and the sibling configuration and cache modules): a compact
re-implementation of rgpt_dist's RecurrentGPT forward without training noise. Parameter names are
exactly the native state-dict names; `lm_head` is the tied token embedding.

    h      = wte(ids) + wpe(pos)
    h_pre  = prelude(h)                                   n_pre GPT-2 pre-norm blocks
    h^(0)  = h_pre; for i = 1..r:                         r = config.r_eval, or num_steps per call
        o     = core(W_h h^(i-1) + W_pre h_pre)           n_rec shared blocks, same weights each step
        g     = sigmoid(W_o silu(W_g LN_h(h^(i-1)) + W_gp LN_pre(h_pre)) / tau)
        h^(i) = g * h^(i-1) + (1 - g) * o
    logits = lm_head(ln_f(coda(h^(r))))[..., :vocab_size] padding rows of the embedding dropped

K/V cache (`RecurrentGPTCache`): one entry per prelude and coda block; the shared core keeps one per
(recurrence step, core block) with kv_strategy `full` (exact), or one per core block with `first`,
`last`, `average`: the new tokens of a forward attend at step i to [past tokens' stored K/V, their own
step-i K/V] and, when the forward ends, their step-0 / step-(r-1) / mean-over-steps K/V is appended.
A prompt prefilled in one call is therefore exact under every strategy.

generate(): the model opts out of the DynamicCache that GenerationMixin would otherwise create
(`_supports_default_dynamic_cache` -> False, as Mamba-style models with their own cache do) and
builds its RecurrentGPTCache on the first forward with use_cache=True; GenerationMixin then carries
the returned cache between steps, and the stock `prepare_inputs_for_generation` slices the input to
the uncached tokens (the cache reports its length through `get_seq_length`). The cache subclasses
transformers' `Cache`, with one `DynamicLayer` per K/V slot, so beam search (reorder_cache), crop and
batch selection work unchanged. A fresh, empty cache of another type (e.g. a DynamicCache a caller
made) is replaced by a RecurrentGPTCache; a non-empty one is refused. use_cache=False recomputes the
whole sequence each step.

transformers 4.57 and 5.x: the cache is accepted as `past_key_values` (4.x) or `cache` (5.x renamed
it) and returned under the output field this version has; `_tied_weights_keys` is a {target: source}
mapping (5.x expands it; 4.x iterates its keys); `cache_position` (removed in 5.x) is neither needed
nor declared, and return_dict is read from `config.return_dict` (5.x deprecates `use_return_dict`).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .cache_rgpt import RecurrentGPTCache
from .configuration_rgpt import RecurrentGPTHFConfig, check_r_eval

# the output field holding the cache: `cache` from transformers 5 on, `past_key_values` before
_CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


# ----------------------------------------------------------------------------------------- model

class RGPTAttention(nn.Module):
    """Causal self-attention; the fused qkv's output features are laid out per head as
    [head, (q|k|v), head_dim] (the native layout, not GPT-2's [(q|k|v), head, head_dim])."""

    def __init__(self, config: RecurrentGPTHFConfig):
        super().__init__()
        d = config.d_model
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.qkv = nn.Linear(d, 3 * d, bias=config.bias)
        self.proj = nn.Linear(d, d, bias=config.bias)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], kv=None) -> torch.Tensor:
        """x: (B, T, d) new tokens; mask: None = causal within x (no past, no padding), else a boolean
        (T, P + T) or (B, 1, T, P + T) mask; kv: a cache slot whose update(k, v) returns [past, new]."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, self.n_head, 3, self.head_dim).permute(3, 0, 2, 1, 4).unbind(0)
        if kv is not None:
            k, v = kv.update(k, v)                                   # (B, H, P + T, hd)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # explicit: SDPA's is_causal aligns top-left when P > 0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class RGPTMLP(nn.Module):
    def __init__(self, config: RecurrentGPTHFConfig):
        super().__init__()
        self.fc = nn.Linear(config.d_model, 4 * config.d_model, bias=config.bias)
        self.proj = nn.Linear(4 * config.d_model, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


def _layer_norm(config: RecurrentGPTHFConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.d_model, eps=config.ln_eps, bias=config.bias)


class RGPTBlock(nn.Module):
    """GPT-2 pre-norm block."""

    def __init__(self, config: RecurrentGPTHFConfig):
        super().__init__()
        self.ln_1 = _layer_norm(config)
        self.attn = RGPTAttention(config)
        self.ln_2 = _layer_norm(config)
        self.mlp = RGPTMLP(config)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], kv=None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask, kv)
        return x + self.mlp(self.ln_2(x))


class RGPTEmbeddings(nn.Module):
    def __init__(self, config: RecurrentGPTHFConfig):
        super().__init__()
        self.wte = nn.Embedding(config.padded_vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.block_size, config.d_model)


class RGPTRecurrence(nn.Module):
    """The gated recurrence; W_proj and the gate's first layer are split into their h and h_pre
    halves (proj_h/proj_pre, gate_h/gate_pre) as in the native model."""

    def __init__(self, config: RecurrentGPTHFConfig):
        super().__init__()
        d = config.d_model
        self.tau = config.tau
        self.proj_h = nn.Linear(d, d, bias=False)
        self.proj_pre = nn.Linear(d, d, bias=False)
        self.blocks = nn.ModuleList(RGPTBlock(config) for _ in range(config.n_rec))
        self.ln_h = _layer_norm(config)
        self.ln_pre = _layer_norm(config)
        self.gate_h = nn.Linear(d, d, bias=True)
        self.gate_pre = nn.Linear(d, d, bias=False)
        self.gate_out = nn.Linear(d, d, bias=True)

    def step(self, h: torch.Tensor, anchor: tuple[torch.Tensor, torch.Tensor], mask, kvs) -> torch.Tensor:
        proj_pre, gate_pre = anchor
        o = self.proj_h(h) + proj_pre
        for block, kv in zip(self.blocks, kvs if kvs is not None else [None] * len(self.blocks)):
            o = block(o, mask, kv)
        g = torch.sigmoid(self.gate_out(F.silu(self.gate_h(self.ln_h(h)) + gate_pre)) / self.tau)
        return torch.lerp(o.to(h.dtype), h, g.to(h.dtype))  # g * h + (1 - g) * o; under autocast o, g are bf16


class RGPTHead(nn.Module):
    def __init__(self, config: RecurrentGPTHFConfig):
        super().__init__()
        self.ln_f = _layer_norm(config)


class RecurrentGPTPreTrainedModel(PreTrainedModel):
    config_class = RecurrentGPTHFConfig
    base_model_prefix = "rgpt_model"  # no such submodule: the causal-LM class is the whole model
    supports_gradient_checkpointing = False
    _no_split_modules = ["RGPTBlock", "RGPTRecurrence"]
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        """For from-scratch construction only (an export loads every weight): N(0, init_std) linears
        and embeddings, zero biases, unit LayerNorms, gate bias +4 (no residual scaling)."""
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        if isinstance(module, RGPTRecurrence):
            nn.init.constant_(module.gate_out.bias, self.config.gate_bias_init)


class RecurrentGPTForCausalLM(RecurrentGPTPreTrainedModel, GenerationMixin):
    # {target: source}: transformers 5 ties from this mapping; 4.x iterates it (target names) and ties
    # get_output_embeddings() to get_input_embeddings()
    _tied_weights_keys = {"lm_head.weight": "embed.wte.weight"}

    def __init__(self, config: RecurrentGPTHFConfig):
        config.validate_inference()
        super().__init__(config)
        self.embed = RGPTEmbeddings(config)
        self.prelude = nn.ModuleList(RGPTBlock(config) for _ in range(config.n_pre))
        self.recurrence = RGPTRecurrence(config)
        self.coda = nn.ModuleList(RGPTBlock(config) for _ in range(config.n_coda))
        self.head = RGPTHead(config)
        self.lm_head = nn.Linear(config.d_model, config.padded_vocab_size, bias=False)  # tied to embed.wte
        self.post_init()

    # transformers' hooks
    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed.wte = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model builds its own RecurrentGPTCache (module docstring)

    def make_cache(self, r: Optional[int] = None, strategy: Optional[str] = None) -> RecurrentGPTCache:
        """An empty cache for depth r (default config.r_eval) and strategy (default config.kv_strategy);
        pass it as past_key_values to forward or generate to choose them per call."""
        return RecurrentGPTCache(self.config, r, strategy)

    def _resolve_cache(self, past_key_values, use_cache: bool, r: int) -> Optional[RecurrentGPTCache]:
        if isinstance(past_key_values, RecurrentGPTCache):
            return past_key_values
        if past_key_values is None:
            return self.make_cache(r) if use_cache else None
        if isinstance(past_key_values, Cache) and past_key_values.get_seq_length() == 0:
            return self.make_cache(r)  # an empty generic cache (e.g. made by a caller): replace it
        raise TypeError(f"past_key_values must be a RecurrentGPTCache (model.make_cache()), got "
                        f"{type(past_key_values).__name__}: the recurrent core's K/V do not fit a per-layer cache")

    @staticmethod
    def _mask(attention_mask: Optional[torch.Tensor], t: int, past: int, device) -> Optional[torch.Tensor]:
        """None (plain causal) when there is neither a past nor padding; otherwise a boolean mask,
        (T, P + T), or (B, 1, T, P + T) with padding, where query t sits at position P + t."""
        s = past + t
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None
        if attention_mask is None and past == 0:
            return None
        q_pos = torch.arange(past, s, device=device)[:, None]
        k_pos = torch.arange(s, device=device)[None, :]
        mask = k_pos <= q_pos                                          # (T, S)
        if attention_mask is not None:
            # padded keys are hidden; every query keeps itself, so no row is all False (SDPA -> NaN)
            mask = (mask[None] & attention_mask.bool()[:, None, :]) | (k_pos == q_pos)[None]
            mask = mask[:, None]                                       # (B, 1, T, S)
        return mask

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        past_key_values: Optional[Cache] = None,
        inputs_embeds: Optional[torch.FloatTensor] = None,
        labels: Optional[torch.LongTensor] = None,
        use_cache: Optional[bool] = None,
        output_hidden_states: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        logits_to_keep: int = 0,
        num_steps: Optional[int] = None,
        cache: Optional[Cache] = None,
        **kwargs,
    ):
        """input_ids (B, T): the tokens after those in past_key_values. attention_mask (B, P + T): 1 for
        real tokens, 0 for padding (positions then count real tokens only unless position_ids is
        given). labels (B, T): shifted inside, -100 ignored. num_steps: recurrence depth for this call
        (default config.r_eval; a cache is tied to one depth). logits_to_keep: > 0 computes logits for
        the last that many positions only. cache: transformers 5's name for past_key_values (pass one of
        them). Other keyword arguments GenerationMixin passes (4.x's cache_position) are ignored:
        positions follow the cache length."""
        if cache is not None:
            if past_key_values is not None and past_key_values is not cache:
                raise ValueError("pass the KV cache as one of past_key_values and cache, not both")
            past_key_values = cache
        r = self.config.r_eval if num_steps is None else check_r_eval(num_steps)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        B, T = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        device = self.embed.wpe.weight.device

        cache = self._resolve_cache(past_key_values, use_cache, r)
        past = 0 if cache is None else cache.get_seq_length()
        if attention_mask is not None and attention_mask.shape != (B, past + T):
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; expected (batch, cached + "
                             f"new tokens) = ({B}, {past + T})")
        if position_ids is None:
            if attention_mask is not None and not bool(attention_mask.all()):
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
            else:
                position_ids = torch.arange(past, past + T, device=device)[None]
        if past + T > self.config.block_size or int(position_ids.max()) >= self.config.block_size:
            raise ValueError(f"sequence length {past + T} exceeds block_size={self.config.block_size}")
        mask = self._mask(attention_mask, T, past, device)
        if cache is not None:
            cache.begin(T, r)  # after every check of the inputs: a refused call leaves the cache as it was

        h = (self.embed.wte(input_ids) if inputs_embeds is None else inputs_embeds) + self.embed.wpe(position_ids)
        hidden = [h] if output_hidden_states else None                # embeddings, h^(0..r), ln_f output
        for j, block in enumerate(self.prelude):
            h = block(h, mask, None if cache is None else cache.prelude_kv(j))
        if hidden is not None:
            hidden.append(h)
        if r > 0:
            anchor = (self.recurrence.proj_pre(h), self.recurrence.gate_pre(self.recurrence.ln_pre(h)))
            for i in range(r):
                h = self.recurrence.step(h, anchor, mask, None if cache is None else cache.core_kv(i))
                if hidden is not None:
                    hidden.append(h)
        for j, block in enumerate(self.coda):
            h = block(h, mask, None if cache is None else cache.coda_kv(j))
        if cache is not None:
            cache.end(T)
        h = self.head.ln_f(h)
        if hidden is not None:
            hidden.append(h)

        loss = None
        if labels is not None:  # HF convention: position t predicts labels[t + 1]
            logits = self.lm_head(h)[..., : self.config.vocab_size]
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        else:
            keep = h[:, -logits_to_keep:] if isinstance(logits_to_keep, int) and logits_to_keep > 0 else h
            logits = self.lm_head(keep)[..., : self.config.vocab_size]

        out = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=None if hidden is None else tuple(hidden),
                                     **{_CACHE_FIELD: cache})
        return out if return_dict else out.to_tuple()
