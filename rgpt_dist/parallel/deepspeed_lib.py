"""DeepSpeed, imported once, after its accelerator is chosen; the package takes DeepSpeed's names
from here and nowhere else.

DeepSpeed picks its accelerator when it is first imported (CUDA when it finds it) and keeps it for
the life of the process; without CUDA it must be told to use the CPU before that import
(DS_ACCELERATOR=cpu; a value the user set stays). Importing any DeepSpeed module first through this
one makes that order hold everywhere, instead of a call before each import."""
from __future__ import annotations

import os

import torch


def use_cpu_accelerator() -> None:
    """DS_ACCELERATOR=cpu where torch sees no CUDA device (a user's own setting wins)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


use_cpu_accelerator()

# DeepSpeed itself, below the accelerator choice above (hence E402)
import deepspeed  # noqa: E402
from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal  # noqa: E402
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine  # noqa: E402
from deepspeed.runtime.utils import is_model_parallel_parameter  # noqa: E402
from deepspeed.runtime.zero.partition_parameters import register_external_parameter  # noqa: E402
from deepspeed.utils import set_z3_leaf_module  # noqa: E402

__all__ = ["deepspeed", "ds_to_universal", "TorchCheckpointEngine", "is_model_parallel_parameter",
           "register_external_parameter", "set_z3_leaf_module", "use_cpu_accelerator"]
