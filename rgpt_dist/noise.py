"""Keyed noise for training-time perturbations (RecurrentGPT's eps_x and eps_g, Poisson's s^(0)).

A draw is a pure function of (seed, step, micro-batch, data-parallel rank, recurrence index,
stream name) and the shape. Two consequences the distributed code relies on:
- recomputation under activation checkpointing redraws exactly the same noise;
- tensor-parallel ranks of one data-parallel rank (which hold replicated activations) draw the
  same noise, because the tensor-parallel rank is not part of the key.

How a draw is made (no torch.Generator, so torch.compile can trace it):
1. `NoiseKey` hashes (seed, step, micro_batch, dp_rank) once, in Python, when it is built
   (`derive_seed`, blake2b): two 32-bit base words, an int64 tensor of shape (2,) on the CPU;
   `at(i)` passes them on (narrowing hashes nothing).
2. `normal(stream, ...)` mixes the recurrence index and the stream (FNV-1a of its name, a Python
   constant) into the base words with the 32-bit integer hash `_mix32` (Wellons' "lowbias32"):
   the draw's key (k0, k1). The map from (recurrence, stream) to (k0, k1) is a bijection for fixed
   base words, so two streams or steps of one forward never share a key.
3. A counter-based generator (`keyed_normal`, given (k0, k1) as a tensor): element counter
   c = 0, 1, ... (an arange) gives the 32-bit word h(c) = mix32(mix32(c ^ k0) ^ k1); the words of
   counters 2j, 2j+1 give the uniforms
   u1 = (h(2j) + 1) 2^-32 in (0, 1] (never log(0); tails reach 6.66 sigma) and u2 = 24 bits of
   h(2j + 1) in [0, 1), and Box-Muller turns them into elements 2j and 2j+1:
   sqrt(-2 ln u1) (cos, sin)(2 pi u2). fp32 throughout, multiplied by std, then cast to the dtype.
Every integer is held in int64 below 2^32 and every product stays below 2^63 in magnitude (a
multiplier >= 2^31 is used as its negative residue c - 2^32; masking with 2^32 - 1 then gives the
product mod 2^32), so no signed overflow happens in eager kernels or in inductor's generated code.
A call draws at most 2^32 - 2 elements (a (B, T, d) of 16 x 1024 x 4096 is 6.7e7).

Devices: the integer words and both uniforms are bitwise identical on every device; the normals go
through fp32 log, sqrt, cos and sin, so CPU and CUDA agree to a few ulp, not bitwise (the ranks
that must agree bitwise, a data-parallel replica's tensor-parallel ranks and a recomputation, run
the same kernels on the same kind of device; CUDA was not measured: no GPU was lent). Compiled
draws: bitwise eager's with aot_eager; inductor's fused CPU kernel differs from eager in about 5%
of elements by at most 3 ulp (measured), so eager and compiled runs draw the same noise to fp32
rounding, and every draw of one run (recomputation included) comes from the same code.

torch.compile: eagerly, the key enters as Python ints (no tensor work for the key, no
host-to-device copy). Under compilation (`torch.compiler.is_compiling()`) it enters as the base-word
tensor, copied to the device (non-blocking, 16 bytes) and mixed with tensor ops, so a new key every
step is a new graph input, not a new constant: compiling LoopedLM's whole forward (its Python loop
over recurrence steps unrolled, `key.at(i)` inside) with a new NoiseKey every call gives no graph
break and no recompilation (tests/test_noise.py: the forward with activation checkpointing under
aot_eager, the draws alone under aot_eager and inductor; the forward under inductor was measured
once: 1 frame, 0 breaks, 442 s to compile on 2 busy cores). The only
NoiseKey ints the traced code reads are the recurrence (a constant of the unrolled loop) and the
stream name; `at()` uses dataclasses.replace, through which dynamo passes the other ints without
guarding on them (torch 2.13; the test catches a change). `NoiseKey.fresh()` (a forward in training
mode given no key) graph-breaks: compiled training passes a key, as the trainer does.

Cost: eager, a draw is about 30 elementwise passes (22 int64 ops over the counters, Box-Muller over
the pairs) where torch.randn is one; inductor fuses them into one kernel. 1e7 fp32 elements on
this project's 2-core VM: torch.Generator + torch.randn (the old draw) 0.068-0.094 s; this draw
eager 1.05-2.45 s, compiled 0.076-0.139 s. So where the noise stays outside compiled code
(parallel.compile=blocks), `compile_draws` routes it through one compiled kernel (dynamic shapes:
compiled once, about 25 s on CPU); with compile=none the eager draw's cost remains (on a GPU it is
memory-bound, roughly 500 bytes of traffic per element: an estimate, no GPU was lent).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Union

import torch

from rgpt_dist.seeding import derive_seed

M32 = 0xFFFFFFFF
MAX_ELEMENTS = 2**32 - 2  # counters 0 .. numel (rounded up to even) - 1 stay below 2^32
# lowbias32's multipliers (x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16):
# the second as its negative residue, so a product with x < 2^32 stays within (-2^63, 2^63)
_MUL1, _MUL2 = 0x7FEB352D, 0x846CA68B - 2**32

Word = Union[int, torch.Tensor]


def _mix32(x: Word) -> Word:
    """lowbias32 of a 32-bit word in [0, 2^32): a Python int, or an int64 tensor (elementwise). A
    bijection of the 32-bit words; every intermediate is in [0, 2^32) or a product below 2^63."""
    x = x ^ (x >> 16)
    x = (x * _MUL1) & M32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & M32
    return x ^ (x >> 16)


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """`_mix32` in place on an int64 tensor (eager draws keep one big temporary, not five)."""
    x.bitwise_xor_(x >> 16).mul_(_MUL1).bitwise_and_(M32)
    x.bitwise_xor_(x >> 15).mul_(_MUL2).bitwise_and_(M32)
    return x.bitwise_xor_(x >> 16)


def stream_id(stream: str) -> int:
    """32-bit FNV-1a of the stream name's code points: a pure Python function of a constant string,
    which dynamo folds (no hashlib in the traced code)."""
    h = 0x811C9DC5
    for ch in stream:
        h = ((h ^ ord(ch)) * 0x01000193) & M32
    return h


def draw_key(words: tuple[Word, Word], recurrence: int, stream: str) -> tuple[Word, Word]:
    """(k0, k1) of one draw from the base words (two 32-bit words: ints or 0-d int64 tensors), the
    recurrence index (-1: none) and the stream. For fixed base words a bijection of
    (recurrence mod 2^32, stream_id(stream))."""
    x0 = _mix32(words[0] ^ (recurrence & M32))
    x1 = _mix32(words[1] ^ stream_id(stream) ^ x0)
    return _mix32(x0 ^ x1), x1


def _normals(k0: Word, k1: Word, numel: int, device: torch.device | str | None) -> torch.Tensor:
    """`numel` N(0, 1) fp32 values (1-D) from the counter-based hash keyed by (k0, k1)."""
    if not 0 <= numel <= MAX_ELEMENTS:
        raise ValueError(f"keyed noise draws at most {MAX_ELEMENTS} elements per call, not {numel}")
    pairs = (numel + 1) // 2
    h = torch.arange(2 * pairs, device=device, dtype=torch.int64)
    h = _mix32_(_mix32_(h.bitwise_xor_(k0)).bitwise_xor_(k1)).view(pairs, 2)
    u1 = (h[:, 0] + 1).to(torch.float32).mul_(2.0**-32)                  # (0, 1]: exact multiples of 2^-32
    u2 = (h[:, 1] >> 8).to(torch.float32).mul_(2.0**-24)                 # [0, 1): 24 bits, exact
    radius = torch.log(u1).mul_(-2.0).sqrt_()
    theta = u2.mul_(2.0 * math.pi)
    z = torch.stack((radius * torch.cos(theta), radius * torch.sin(theta)), dim=1).view(2 * pairs)
    return z[:numel]


def keyed_normal(key_words: torch.Tensor, shape: torch.Size | tuple[int, ...],
                 device: torch.device | str | None = None) -> torch.Tensor:
    """N(0, 1) fp32 of `shape` on `device`, a pure function of `key_words` (int64 (2,), two words in
    [0, 2^32), on any device) and the shape; only tensor operations, so the key may change every
    call of a compiled function without recompiling it."""
    k = key_words.to(device=device, dtype=torch.int64, non_blocking=True)
    return _normals(k[0], k[1], math.prod(shape), device).view(shape)


_compiled_draw = None  # set by compile_draws: keyed_normal compiled once for every shape


def compile_draws(backend: str = "inductor") -> None:
    """Draw eager noise through one compiled kernel (dynamic shapes: compiled once). Eagerly, the
    hash is about 30 elementwise passes (11x torch.randn's time on CPU); fused it costs about one.
    For regional compilation (rgpt_dist.parallel.compile), where the noise stays outside the compiled
    blocks. Same values as the eager draw up to a few ulp of the fp32 transcendental functions."""
    global _compiled_draw
    _compiled_draw = torch.compile(keyed_normal, dynamic=True, backend=backend)


@dataclasses.dataclass(frozen=True)
class NoiseKey:
    """Identifies one micro-batch's forward pass; `at(i)` narrows it to recurrence step i.
    `words` is internal: `at` passes the base words on, so narrowing hashes nothing (and can be
    traced); left None, they are derived from (seed, step, micro_batch, dp_rank)."""

    seed: int
    step: int = 0
    micro_batch: int = 0
    dp_rank: int = 0
    recurrence: int = -1
    words: dataclasses.InitVar[torch.Tensor | None] = None

    def __post_init__(self, words: torch.Tensor | None) -> None:
        if words is None:
            s = derive_seed(self.seed, self.step, self.micro_batch, self.dp_rank)
            words = torch.tensor([s & M32, s >> 32], dtype=torch.int64, device="cpu")  # whatever the default device
        object.__setattr__(self, "_words", words)   # int64 (2,) on the CPU: the base words

    @classmethod
    def fresh(cls) -> "NoiseKey":
        """A key from torch's global RNG, for forwards in training mode that were given none
        (reproducible under torch.manual_seed; recomputation-safe because it is drawn once per forward)."""
        return cls(seed=int(torch.randint(0, 2**62, (1,)).item()))

    def at(self, recurrence: int) -> "NoiseKey":
        return dataclasses.replace(self, recurrence=recurrence, words=self._words)

    def normal(self, stream: str, shape: torch.Size | tuple[int, ...], std: float,
               device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """N(0, std^2) of `shape`, drawn in fp32 (identical across dtypes) then cast to `dtype`."""
        if torch.compiler.is_compiling():   # the key as a graph input: a new key is no new graph
            w = self._words.to(device=device, non_blocking=True)
            k0, k1 = draw_key((w[0], w[1]), self.recurrence, stream)
        else:                               # eager: Python ints, no tensor work for the key
            k0, k1 = draw_key(tuple(self._words.tolist()), self.recurrence, stream)
            if _compiled_draw is not None:  # (compile_draws) one fused kernel, the key as an input
                z = _compiled_draw(torch.tensor([k0, k1], dtype=torch.int64), (math.prod(shape),), device)
                return z.view(shape).mul_(std).to(dtype)  # (1-D inside: one graph for every shape)
        z = _normals(k0, k1, math.prod(shape), device).view(shape)
        return z.mul_(std).to(dtype)
