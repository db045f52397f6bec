"""An exported prelude/core/coda model (or a model without a recurrence depth that ships its code:
RLT, RT) for Hugging Face `transformers` (`trust_remote_code=True`).

A thin adapter: `RGPTForCausalLM.model` is the native model (`NativeModel`, bound by the import
rgpt-export appends to this file; its modules are the ones rgpt_dist trains, shipped verbatim but for
their imports), so the export computes exactly what the trainer does. Parameter names are the native ones under `model.`; the
head multiplies by the matrix the native head reads (`model.head.wte[0]`): the token embedding
(`model.embed.wte`, tied by construction) or a family's untied head matrix (RT: `model.embed.unembed`,
a parameter of its own). Neither is declared to transformers as output embeddings, so nothing is tied
or untied at load.

What the adapter adds: transformers' conventions (labels shifted inside, -100 ignored; logits over
the real vocabulary, token ids outside it refused; attention_mask with left padding, positions then
counting real tokens; logits_to_keep), the recurrence depth per call (`num_steps`, default
config.r_eval; None and refused for a model without a depth), and the cache. position_ids equal to the positions the cache implies
(past + 0..T-1 in every row, what generate() passes for an unpadded batch) are not passed on: they
say nothing the native model does not know, and a model that takes no positions (RLT, unpadded
batches only) then runs.

generate(): the model opts out of the DynamicCache GenerationMixin would otherwise create
(`_supports_default_dynamic_cache` -> False, as models with their own cache do) and builds its
RGPTCache on the first forward with use_cache=True; GenerationMixin carries it between steps, and the
stock `prepare_inputs_for_generation` slices the input to the uncached tokens (the cache reports
its length through `get_seq_length`). A fresh, empty cache of another type (e.g. a DynamicCache a
caller made) is replaced by an RGPTCache; a non-empty one is refused. use_cache=False recomputes the
whole sequence each step.

transformers 4.57 and 5.x: the cache is accepted as `past_key_values` (4.x) or `cache` (5.x renamed
it) and returned under the output field this version has; `cache_position` (removed in 5.x) is
neither needed nor declared; return_dict is read from `config.return_dict`.
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

from .cache_rgpt import RGPTCache
from .configuration_rgpt import RGPTConfig
from .layers import padding_mask

NativeModel = None  # the family's model class: rebound by the import rgpt-export appends at the end

# the output field holding the cache: `cache` from transformers 5 on, `past_key_values` before
_CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


class RGPTPreTrainedModel(PreTrainedModel):
    config_class = RGPTConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing: the native modules initialise themselves, and an export loads every weight."""


class RGPTForCausalLM(RGPTPreTrainedModel, GenerationMixin):
    def __init__(self, config: RGPTConfig):
        config.validate_inference()
        super().__init__(config)
        self.model = NativeModel(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        tied = self.model.head.wte[0] is self.model.embed.wte  # an untied head keeps its own matrix
        self.model.embed.wte = value
        if tied:
            self.model.head.wte = [value]

    def get_output_embeddings(self) -> None:
        return None  # the head reads its matrix itself (module docstring): nothing for transformers to tie

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model builds its own RGPTCache (module docstring)

    def make_cache(self, r: Optional[int] = None, strategy: Optional[str] = None) -> RGPTCache:
        """An empty cache for depth r (default config.r_eval) and strategy (default config.kv_strategy);
        pass it as past_key_values to forward or generate to choose them per call."""
        return RGPTCache(self.config, r, strategy, self.model.make_cache)

    def _resolve_cache(self, past_key_values, use_cache: bool, r: int) -> Optional[RGPTCache]:
        if isinstance(past_key_values, RGPTCache):
            return past_key_values
        if past_key_values is None:
            return self.make_cache(r) if use_cache else None
        if isinstance(past_key_values, Cache) and past_key_values.get_seq_length() == 0:
            return self.make_cache(r)  # an empty generic cache (e.g. made by a caller): replace it
        raise TypeError(f"past_key_values must be an RGPTCache (model.make_cache()), got "
                        f"{type(past_key_values).__name__}: the recurrent core's K/V do not fit a per-layer cache")

    def _positions(self, attention_mask, position_ids, past: int, t: int):
        """(mask, positions) for the native forward: both None for an unpadded batch."""
        if attention_mask is not None and attention_mask.shape != (attention_mask.shape[0], past + t):
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; expected (batch, cached + "
                             f"new tokens) = ({attention_mask.shape[0]}, {past + t})")
        mask = positions = None
        if attention_mask is not None and not bool(attention_mask.all()):
            mask, positions = padding_mask(attention_mask.to(self.device), t)
        if position_ids is not None:
            positions = position_ids.to(self.device)
            default = torch.arange(past, past + t, device=positions.device)
            if mask is None and positions.shape[-1] == t and bool((positions == default).all()):
                positions = None  # the default positions (module docstring)
        # (only learned positions end at block_size; rope / alibi read no positions from here)
        if positions is not None and getattr(self.config, "pos_encoding", "learned") == "learned" \
                and int(positions.max()) >= self.config.block_size:
            raise ValueError(f"position {int(positions.max())} exceeds block_size={self.config.block_size}")
        return mask, positions

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
        (default config.r_eval; a cache is tied to one depth). logits_to_keep: > 0 returns logits for
        the last that many positions only. cache: transformers 5's name for past_key_values (pass one
        of them). Other keyword arguments GenerationMixin passes (4.x's cache_position) are ignored:
        positions follow the cache length."""
        if cache is not None:
            if past_key_values is not None and past_key_values is not cache:
                raise ValueError("pass the KV cache as one of past_key_values and cache, not both")
            past_key_values = cache
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("pass input_ids (inputs_embeds is not supported: the native model embeds its tokens)")
        if output_hidden_states:
            raise ValueError("output_hidden_states is not supported by this export")
        if input_ids.numel() and not 0 <= int(input_ids.min()) <= int(input_ids.max()) < self.config.vocab_size:
            bad = int(input_ids.max()) if int(input_ids.max()) >= self.config.vocab_size else int(input_ids.min())
            raise ValueError(f"input_ids hold token {bad}, outside this model's vocabulary of {self.config.vocab_size} "
                             f"tokens (0..{self.config.vocab_size - 1}): the tokenizer does not fit the model (an "
                             f"algorithmic task's model reads its task's ids, not GPT-2 text)")
        r = self.config.depth(num_steps)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        return_dict = self.config.return_dict if return_dict is None else return_dict
        cache = self._resolve_cache(past_key_values, use_cache, r)
        mask, positions = self._positions(attention_mask, position_ids, 0 if cache is None else cache.get_seq_length(),
                                          input_ids.shape[1])
        out = self.model(input_ids.to(self.device), r=r, cache=None if cache is None else cache.kv, mask=mask,
                         positions=positions)
        logits = out.logits[..., : self.config.vocab_size]                 # (B, T, V): padding rows dropped
        loss = None
        if labels is not None:  # HF convention: position t predicts labels[t + 1]
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        elif isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
        result = CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: cache})
        return result if return_dict else result.to_tuple()


# rgpt-export appends the model class (as NativeModel) and one import per shipped native module below:
# for a local directory transformers copies the files the entry module imports, not those they import.
