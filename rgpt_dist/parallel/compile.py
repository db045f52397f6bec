"""torch.compile applied from outside the model (like torchtitan's `apply_compile`).

`blocks` (regional compilation) compiles the `forward` of every transformer `Block` and of the
`LMHead` in place: the state dict keeps its names (checkpoints and exports do not change), and the
module's own hooks stay outside the graph. Under ZeRO-3 those hooks gather the whole unit's
parameters (rgpt_dist.parallel.zero.gather_per_unit: none run inside the graph), the head's tied
embedding among them (register_tied_parameters); docs/parallelism.md has the counts.
The recurrence loop, the depth r, the keyed noise and the family's step arithmetic stay eager
around them: a Block computes the same function at every depth and every step of the shared core,
so a new r every optimizer step compiles nothing new. All Blocks share one code object and dynamo
inlines their parameters as graph inputs, so one graph serves every Block of a shape (measured on
the debug RecurrentGPT: 2 graphs, Block and head, for any r; see tests/parallel/test_compile.py).
The eager noise draws go through one more compiled kernel (rgpt_dist.noise.compile_draws: the
counter-based hash is ~30 elementwise passes unfused, 1 fused).
Variants that do compile once more, then never again: a Block run without autograd (the first
r - k steps of truncated backprop, evaluation) and the head without targets (generation).

`model` compiles the whole forward: the loop unrolls, so one graph per depth r (and per variant),
and dynamo's `recompile_limit` is raised to MODEL_RECOMPILE_LIMIT to hold them; a depth beyond
that runs eagerly. For fixed-depth runs or a small R; the noise must then be traceable
(rgpt_dist.noise).

Order with the other wrappers: compilation first, then activation checkpointing wraps its units
(the recurrence step around compiled Blocks, or a dense model's compiled Blocks themselves:
`torch.utils.checkpoint` re-runs the compiled forward in backward), then DeepSpeed wraps the model.
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn as nn
from torch._dynamo.utils import counters

from rgpt_dist import noise
from rgpt_dist.models.layers import Block, LMHead

Mode = Literal["none", "blocks", "model"]
MODEL_RECOMPILE_LIMIT = 64


def compile_units(model: nn.Module) -> list[nn.Module]:
    """The modules `blocks` compiles: every transformer Block (prelude, shared core, coda, or a
    dense model's blocks) and the LM head with its loss."""
    return [m for m in model.modules() if isinstance(m, (Block, LMHead))]


def apply_compile(model: nn.Module, mode: Mode, backend: str = "inductor") -> list[nn.Module]:
    """Compile `model` in place for `mode` (none | blocks | model); returns the compiled modules.
    backend: torch.compile's (inductor on GPUs; aot_eager traces the same graphs without code
    generation, for CPU tests)."""
    if mode == "none":
        return []
    if mode == "blocks":
        units = compile_units(model)
        noise.compile_draws(backend)  # the keyed noise stays outside the blocks: fuse its hash
        # A Block that sees several sequence lengths (MoR's routed recursions) has a static graph and
        # a dynamic one; dynamo tries the most recently used first, so activation checkpointing's
        # recomputation could take the other graph than the forward did and save a different set of
        # tensors (CheckpointError, pytorch#166926). Checked in compilation order, each call finds the
        # graph its forward used.
        torch._C._dynamo.eval_frame._set_lru_cache(False)
    elif mode == "model":
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, MODEL_RECOMPILE_LIMIT)
        units = [model]
    else:
        raise ValueError(f"parallel.compile={mode!r} must be none, blocks or model")
    for unit in units:
        unit.forward = torch.compile(unit.forward, backend=backend)
    return units


def compile_stats() -> dict[str, int]:
    """This process's compilation so far: frames compiled (each compilation and recompilation of a
    region) and graph breaks inside compiled regions. Logged with every training record, so a run
    shows that r changing every step compiles nothing new."""

    return {"compiled_frames": int(counters["frames"]["ok"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}
