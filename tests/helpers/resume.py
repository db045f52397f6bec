"""A Trainer holding only what `resume()` reads, for tests of the same-run check (tests/train)."""
from __future__ import annotations

import types
from pathlib import Path


def resuming_trainer(cfg, saved: dict):
    """A Trainer of `cfg` whose newest checkpoint recorded the config `saved` (a to_dict() mapping);
    loading its state fails the test: the configs must be compared first."""
    from rgpt_dist.train.trainer import Trainer

    def load(engine, tag, universal=False):
        raise AssertionError(f"state was loaded before the configs were compared (universal={universal})")

    trainer = Trainer.__new__(Trainer)
    trainer.cfg, trainer.engine = cfg, None
    trainer.dims = types.SimpleNamespace(dp=1, is_main=False)  # the checkpoint's dp size is unknown here: the same
    trainer.ckpt = types.SimpleNamespace(newest_valid=lambda: "step_00000003", saved_config=lambda tag: saved,
                                         load=load, dir=Path("/runs/x/checkpoints"))
    return trainer
