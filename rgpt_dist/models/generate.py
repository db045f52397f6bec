"""Autoregressive generation for any model family with `forward(idx, r=, cache=)` and
`make_cache(strategy, r)`: prefill the prompt in one call, then one token per call.

    tokens = generate(model, prompt, 32, r=8, strategy="average")     # (B, T + 32)

strategy=None uses no cache and recomputes the whole prefix for every new token (the reference
the cached strategies are tested against).

The cache is static (rgpt_dist.models.kv_cache.StaticLayerCache), sized to the tokens that are fed
(prompt + max_new_tokens - 1: the last new token is sampled, never fed back): its buffers are
allocated by the prefill and each decode step writes one token's K/V in place. The output tokens
are preallocated too, so a decode step concatenates nothing.

compile_backend="inductor" (or "aot_eager", for CPU tests) compiles the decode step. The cache is
then fixed-shape (kv_cache.py): every step feeds one token at a position held in a tensor and
attends over the whole buffers under a mask, so every step has the same shapes and one graph serves
every token (on CUDA, inductor's CUDA graphs: mode reduce-overhead). The prefill runs eagerly. Two
compilations in all per model, strategy and depth: the first decode step specialises the caches'
integer lengths, the second makes them symbolic (dynamo's automatic dynamic), after which nothing
recompiles however many tokens follow.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

from rgpt_dist.models.spec import spec_for

DECODE_RECOMPILE_LIMIT = 64  # compiled decode steps: 2 per (model, strategy, depth) in a process


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


def _fixed_shape_step(model: nn.Module, new: torch.Tensor, cache, depth: dict) -> torch.Tensor:
    """One decode step on a fixed-shape cache whose `slots.index` (1,) holds the new token's position:
    new (B, 1) -> logits (B, V_padded) of the next token."""
    index = cache.slots.index                                                 # (1,)
    mask = (torch.arange(cache.max_len, device=new.device) <= index)[None, None, None]  # (1, 1, 1, max_len)
    return model(new, cache=cache, positions=index.expand(new.shape[0], 1), mask=mask, **depth).logits[:, -1]


@functools.cache
def compiled_step(backend: str, cuda_graphs: bool):
    """_fixed_shape_step compiled for `backend`, with CUDA graphs (mode reduce-overhead) if asked."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, DECODE_RECOMPILE_LIMIT)
    return torch.compile(_fixed_shape_step, backend=backend, mode="reduce-overhead" if cuda_graphs else None)


@torch.no_grad()
def generate(model: nn.Module, idx: torch.Tensor, max_new_tokens: int, *, r: int | None = None,
             strategy: str | None = "full", temperature: float = 0.0, top_k: int | None = None,
             generator: torch.Generator | None = None, eos_token_id: int | None = None,
             compile_backend: str | None = None) -> torch.Tensor:
    """idx: (B, T) prompt token ids -> (B, T + n) with n <= max_new_tokens new tokens (fewer only
    when every row has produced eos_token_id; rows that finished earlier are padded with it).

    r: recurrence depth (None: the model's default; must be None for dense models). strategy: the
    (static) KV cache of `model.make_cache` ("full", "first", "last", "average"), or None for no cache.
    compile_backend: torch.compile's backend for a compiled decode step (module docstring), or None.
    Runs in eval mode and restores the model's previous mode afterwards."""
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    (B, T), block_size = idx.shape, model.cfg.block_size
    if T + max_new_tokens - 1 > block_size:  # the last new token is sampled, never fed back
        raise ValueError(f"prompt of {T} tokens + {max_new_tokens} new tokens exceed block_size={block_size}")
    if compile_backend is not None and strategy is None:
        raise ValueError("compile_backend compiles the cached decode step: it needs a strategy")
    spec = spec_for(model.cfg)
    if strategy is not None and not spec.cached_generation:  # e.g. RLT: no make_cache yet
        raise ValueError(f"{spec.refusal('cached_generation')}; generate with strategy=None (recomputes the "
                         "prefix for every new token)")
    depth = {} if r is None else {"r": r}
    was_training = model.training
    model.eval()
    try:
        fed = min(T + max(max_new_tokens, 1) - 1, block_size)                # tokens the cache will hold
        fixed = compile_backend is not None
        cache = None if strategy is None else model.make_cache(strategy, r, max_len=fed, fixed=fixed)
        step = compiled_step(compile_backend, idx.is_cuda and compile_backend == "inductor") if fixed else None
        out = idx.new_empty((B, T + max_new_tokens))                         # every token, filled as sampled
        out[:, :T] = idx
        new, n = idx, 0                                                      # tokens to feed; tokens sampled
        done = torch.zeros(B, dtype=torch.bool, device=idx.device)
        while n < max_new_tokens:
            if cache is None:
                logits = model(out[:, :T + n], **depth).logits[:, -1]        # (B, V)
            elif step is None or n == 0:                                     # eager, or the prefill
                logits = model(new, cache=cache, **depth).logits[:, -1]
            else:                                                            # the new token sits at T + n - 1
                if cache.slots.index is None:
                    cache.slots.index = torch.empty(1, dtype=torch.long, device=idx.device)
                cache.slots.index.fill_(T + n - 1)
                logits = step(model, new, cache, depth)
            new = sample_next(logits[:, :model.cfg.vocab_size], temperature, top_k, generator)  # (B, 1)
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
