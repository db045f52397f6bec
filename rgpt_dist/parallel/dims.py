"""Process layout: world = tp x dp, validated in one place; read from the launcher's environment."""
from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class ParallelDims:
    world: int
    tp: int
    rank: int
    local_rank: int

    def __post_init__(self):
        if self.tp < 1 or self.world % self.tp:
            raise ValueError(f"world size {self.world} is not divisible by parallel.tp_size={self.tp}")

    @property
    def dp(self) -> int:
        return self.world // self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp  # tp ranks of one data-parallel replica are adjacent

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, tp: int = 1) -> "ParallelDims":
        """torchrun, deepspeed and srun-with-our-wrapper all set RANK / WORLD_SIZE / LOCAL_RANK."""
        return cls(world=int(os.environ.get("WORLD_SIZE", 1)), tp=tp, rank=int(os.environ.get("RANK", 0)),
                   local_rank=int(os.environ.get("LOCAL_RANK", 0)))
