"""Loading `.pt` files that other people wrote, without running their code.

A `.pt` file is a pickle: loading it in full executes whatever the file asks for. Every checkpoint
file the project reads (resume, rgpt-export, rgpt-eval on a run) goes through `load_pt`, which uses
torch's restricted unpickler (`weights_only=True`: tensors, containers, primitives) plus the few
plain DeepSpeed record types its checkpoints hold. A file needing anything else is refused with
`UntrustedCheckpoint`, naming the file and the types it asked for, unless the caller passes
`trust=True` (the `--trust-checkpoint` flag / `checkpoint.trust_pickle`; unsafe: see docs/security.md).
"""
from __future__ import annotations

import importlib
import pickle
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

# Plain data records DeepSpeed pickles into its checkpoints: loss-scaler state (attributes only),
# the ZeRO stage enum and the parameter-fragment address namedtuple. None runs code on unpickling.
DEEPSPEED_RECORDS = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)


class UntrustedCheckpoint(RuntimeError):
    """A checkpoint file that cannot be loaded without running code it names (or cannot be read)."""


def _allowed_globals() -> list[Any]:
    found = []
    for name in DEEPSPEED_RECORDS:
        module, _, attr = name.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):  # another DeepSpeed version: the file will name it
            pass
    return found


def _refusal(path: Path, what: str) -> str:
    return (f"{path}: refusing to load: {what}. Loading it would run code named by the file. Only if "
            f"you trust whoever wrote it, pass --trust-checkpoint (checkpoint.trust_pickle=true when "
            f"resuming); see docs/security.md")


def scan_pt(path: str | Path, shown: Path | None = None) -> str | None:
    """Why load_pt would refuse `path` (read without unpickling anything), or None: lets one rank
    check a whole checkpoint before any rank starts loading it. `shown`: the name for messages."""
    path = Path(path)
    shown = shown or path
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception as e:
        return f"{shown}: not a readable checkpoint file ({type(e).__name__}: {_first_line(e)})"
    foreign = sorted(set(names) - set(DEEPSPEED_RECORDS))
    return _refusal(shown, f"it asks to import {', '.join(foreign[:5])}") if foreign else None


def load_pt(path: str | Path, *, trust: bool = False, map_location: Any = "cpu", **kwargs: Any) -> Any:
    """torch.load restricted to tensors and plain records; UntrustedCheckpoint names the file when
    it asks for more (or is not a readable checkpoint at all)."""
    path = Path(path)
    shown = path.resolve() if path.is_symlink() else path  # readers that link files into a temp dir
    kwargs.pop("weights_only", None)  # callers written for full pickle (DeepSpeed) pass False
    if trust:
        return torch.load(path, map_location=map_location, weights_only=False, **kwargs)
    try:
        with torch.serialization.safe_globals(_allowed_globals()):
            return torch.load(path, map_location=map_location, weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:  # the restricted unpickler met a global: name it
        reason = scan_pt(path, shown) or f"{shown}: not a readable checkpoint file ({_first_line(e)})"
        raise UntrustedCheckpoint(reason) from None
    except Exception as e:  # torn, truncated or crafted bytes: any failure is a refusal, not a crash
        raise UntrustedCheckpoint(f"{shown}: not a readable checkpoint file ({type(e).__name__}: "
                                  f"{_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


class _RestrictedTorch(types.ModuleType):
    """`torch` as seen by a third-party module whose loads must be restricted: everything is torch's
    own, except `load`, which is `load_pt`."""

    def __init__(self, trust: bool):
        super().__init__("torch")
        self._trust = trust

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def load(self, f, map_location=None, **kwargs):  # noqa: D102 - torch.load's signature
        return load_pt(f, trust=self._trust, map_location=map_location, **kwargs)


@contextmanager
def restricted_loads(module: types.ModuleType, trust: bool = False) -> Iterator[None]:
    """Within the block, `module`'s `torch.load` calls go through load_pt (the module's own global
    `torch` is swapped; torch itself and every other module are untouched)."""
    original = module.torch
    module.torch = _RestrictedTorch(trust)
    try:
        yield
    finally:
        module.torch = original
