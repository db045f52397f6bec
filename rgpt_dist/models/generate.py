"""Autoregressive generation for any model family with `forward(idx, r=, cache=)` and
`make_cache(strategy, r)`: prefill the prompt in one call, then one token per call.

    tokens = generate(model, prompt, 32, r=8, strategy="average")     # (B, T + 32)

strategy=None uses no cache and recomputes the whole prefix for every new token (the reference
the cached strategies are tested against).

The cache is static (rgpt_dist.models.kv_cache.StaticLayerCache), sized to the tokens that are fed
(prompt + max_new_tokens - 1: the last new token is sampled, never fed back): its buffers are
allocated by the prefill and each decode step writes one token's K/V in place. The output tokens
are preallocated too, so a decode step concatenates nothing.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def sample_next(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """logits (B, V) -> next tokens (B, 1): argmax at temperature 0, else a draw from the softmax of
    logits / temperature restricted to the top_k most likely tokens."""
    if temperature == 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


@torch.no_grad()
def generate(model: nn.Module, idx: torch.Tensor, max_new_tokens: int, *, r: int | None = None,
             strategy: str | None = "full", temperature: float = 0.0, top_k: int | None = None,
             generator: torch.Generator | None = None, eos_token_id: int | None = None) -> torch.Tensor:
    """idx: (B, T) prompt token ids -> (B, T + n) with n <= max_new_tokens new tokens (fewer only
    when every row has produced eos_token_id; rows that finished earlier are padded with it).

    r: recurrence depth (None: the model's default; must be None for dense models). strategy: the
    (static) KV cache of `model.make_cache` ("full", "first", "last", "average"), or None for no cache.
    Runs in eval mode and restores the model's previous mode afterwards."""
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    (B, T), block_size = idx.shape, model.cfg.block_size
    if T + max_new_tokens - 1 > block_size:  # the last new token is sampled, never fed back
        raise ValueError(f"prompt of {T} tokens + {max_new_tokens} new tokens exceed block_size={block_size}")
    depth = {} if r is None else {"r": r}
    was_training = model.training
    model.eval()
    try:
        fed = min(T + max(max_new_tokens, 1) - 1, block_size)                # tokens the cache will hold
        cache = None if strategy is None else model.make_cache(strategy, r, max_len=fed)
        out = idx.new_empty((B, T + max_new_tokens))                         # every token, filled as sampled
        out[:, :T] = idx
        new, n = idx, 0                                                      # tokens to feed; tokens sampled
        done = torch.zeros(B, dtype=torch.bool, device=idx.device)
        while n < max_new_tokens:
            if cache is None:
                logits = model(out[:, :T + n], **depth).logits               # (B, T + n, V)
            else:
                logits = model(new, cache=cache, **depth).logits             # (B, T_new, V)
            new = sample_next(logits[:, -1, :model.cfg.vocab_size], temperature, top_k, generator)  # (B, 1)
            if eos_token_id is not None:
                new = new.masked_fill(done[:, None], eos_token_id)
                done |= new[:, 0] == eos_token_id
            out[:, T + n] = new[:, 0]
            n += 1
            if eos_token_id is not None and bool(done.all()):
                break
    finally:
        model.train(was_training)
    return out if n == max_new_tokens else out[:, :T + n].clone()  # (a stop before max_new_tokens: contiguous)
