"""Resuming on another layout through DeepSpeed's universal checkpoint.

A ZeRO checkpoint holds one optimizer partition per data-parallel rank and, under tensor
parallelism, one shard per tp rank: DeepSpeed loads it only at the layout that wrote it. Its
universal checkpoint (deepspeed.checkpoint.ds_to_universal) merges every parameter's fp32 master
weights and Adam moments into whole tensors, `DIR/universal/step_N/zero/<name>/{fp32, exp_avg,
exp_avg_sq, step}.pt`, which any data-parallel size and tp size re-partitions on load
(`"checkpoint": {"load_universal": true}`). To merge tp shards it must know how each parameter was
sliced: `universal_info` declares it per parameter from the model's tp layout (layout_for: column
splits and vocabulary embeddings along dim 0, DeepSpeed's default; row-split weights along dim 1;
everything else replicated), saved with every checkpoint under the client-state key DeepSpeed
reads. The vocabulary padding does not depend on tp here (model.pad_vocab_multiple), so nothing is
stripped or re-padded.

What DeepSpeed 0.19.8 converts (read from its source, tested in tests/train/test_layout_change.py):
ZeRO-1 and 2 to any data-parallel size and tp size; ZeRO-3 to any data-parallel size at tp = 1 (its
loader re-partitions whole tensors over the data-parallel group but slices no tp shards for
megatron's layers). ZeRO-0 keeps no partitioned optimizer state: the converter needs ZeRO's files.
`layout_change` names what cannot be converted; the trainer refuses it at start.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import re
import shutil
from pathlib import Path
from typing import Iterator

import torch

from rgpt_dist.durable import UnsafePath, fsync_tree
from rgpt_dist.parallel.deepspeed_lib import ds_to_universal
from rgpt_dist.safe_load import load_pt, restricted_loads

KEY = "universal_checkpoint_info"  # the client-state key ds_to_universal reads


def universal_info(model: torch.nn.Module, layout: dict[str, int | None]) -> dict:
    """How each parameter of `model` is sliced across tp ranks, as ds_to_universal's patterns
    (anchored regexes of whole names; tied parameters appear once, under their first name)."""
    names = {n for n, _ in model.named_parameters()}
    exact = lambda n: "^" + re.escape(n) + "$"  # noqa: E731 (ds_to_universal uses re.match)
    return {"universal_checkpoint_version": 0.4,
            "tp_replicated_parameter_patterns": [exact(n) for n, d in layout.items() if n in names and d is None],
            "parameter_with_row_parallelism_patterns": [exact(n) for n, d in layout.items() if n in names and d == 1]}


def saved_dp(tag_dir: Path) -> int | None:
    """The data-parallel size a ZeRO 1-3 checkpoint was written at, from its file names
    (zero_pp_rank_<dp>_mp_rank_00_optim_states.pt, one per data-parallel rank); None for ZeRO-0."""
    if not tag_dir.is_dir():
        return None
    names = (re.search(r"zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$", p.name) for p in tag_dir.iterdir())
    ranks = {m.group(1) for m in names if m}
    return len(ranks) or None


def layout_change(saved: dict, tag_dir: Path, stage: int, tp: int, dp: int) -> tuple[str | None, str | None]:
    """(what changes, why it cannot be converted) between the checkpoint at `tag_dir` (its saved
    config) and this run's ZeRO stage, tp and data-parallel sizes: (None, None) when nothing that
    shapes the checkpoint changed; a problem when DeepSpeed cannot convert it (0.19.8, its source)."""
    par = saved.get("parallel", {})
    then = (par.get("zero_stage", stage), par.get("tp_size", 1), saved_dp(tag_dir) or dp)  # ZeRO-0: any dp
    now = (stage, tp, dp)
    if then == now:
        return None, None
    describe = lambda s, t, d: f"ZeRO-{s}, tp = {t}, dp = {d}"  # noqa: E731
    change = f"{describe(*then)} -> {describe(*now)}"
    if 0 in (then[0], now[0]):
        return change, "ZeRO-0 keeps no partitioned optimizer state for DeepSpeed's universal checkpoint"
    if then[0] != now[0] and 3 in (then[0], now[0]):
        return change, "DeepSpeed converts between ZeRO-1 and ZeRO-2 only"
    if now[0] == 3 and now[1] > 1:
        return change, "DeepSpeed's ZeRO-3 loader slices no tensor-parallel shards of megatron's layers (tp = 1 only)"
    return change, None


def convert(tag_dir: Path, out_dir: Path) -> Path:
    """The universal checkpoint of `tag_dir` at `out_dir`, made afresh (one found there could have
    been planted), written beside it and renamed into place. Runs on one process (no
    torch.distributed; DeepSpeed's own worker pools off); every file is read with our restricted
    loader (the source should be verified first, as newest_valid does)."""
    tmp, source = out_dir.with_name(out_dir.name + ".tmp"), out_dir.with_name(out_dir.name + ".input")
    for stale in (out_dir.parent, tmp, out_dir, source):  # made afresh every time: never one found here
        if stale.is_symlink():
            raise UnsafePath(f"{stale} is a symbolic link: refusing to convert through it (remove it)")
    for stale in (tmp, out_dir, source):
        shutil.rmtree(stale, ignore_errors=True)
    _stage_input(tag_dir, source)
    with deepspeed_loads_restricted():
        ds_to_universal(argparse.Namespace(input_folder=str(source), output_folder=str(tmp), num_extract_workers=1,
                                        num_merge_workers=1, keep_temp_folder=False, strict=True,
                                        inject_missing_state=False))
    shutil.rmtree(source)
    stray = tmp.parent / "latest_universal"  # the converter points its parent folder at its output
    stray.unlink(missing_ok=True)
    fsync_tree(tmp)
    tmp.rename(out_dir)
    return out_dir


# DeepSpeed's modules that unpickle checkpoint files (with weights_only=False) while converting to
# and loading from a universal checkpoint
_LOADERS = ("deepspeed.checkpoint.ds_to_universal", "deepspeed.checkpoint.deepspeed_checkpoint",
            "deepspeed.checkpoint.reshape_3d_utils", "deepspeed.checkpoint.zero_checkpoint",
            "deepspeed.checkpoint.universal_checkpoint", "deepspeed.runtime.base_optimizer",
            "deepspeed.runtime.zero.stage3", "deepspeed.runtime.zero.stage_1_and_2")


@contextlib.contextmanager
def deepspeed_loads_restricted(trust: bool = False) -> Iterator[None]:
    """Within the block, every torch.load of those DeepSpeed modules goes through our restricted
    loader (rgpt_dist.safe_load): a converted checkpoint is read without running code, like any other."""
    with contextlib.ExitStack() as stack:
        for name in _LOADERS:
            stack.enter_context(restricted_loads(importlib.import_module(name), trust))
        yield


def _stage_input(tag_dir: Path, source: Path) -> None:
    """The converter's input: links to the checkpoint's files, except the model-state files, saved
    again without their None entries. megatron's layers add `<layer>._extra_state` = None to every
    state dict, and ds_to_universal (0.19.8) writes each module entry it found no optimizer state
    for as `fp32.pt` with `tensor.float()`, which fails on None."""
    source.mkdir(parents=True)
    for f in sorted(tag_dir.iterdir()):
        if f.name.endswith("model_states.pt"):
            state = load_pt(f)
            if isinstance(state.get("module"), dict):
                state["module"] = {k: v for k, v in state["module"].items() if v is not None}
            torch.save(state, source / f.name)
        else:
            (source / f.name).symlink_to(f.resolve())
