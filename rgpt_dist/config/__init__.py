"""Typed configuration (no torch import): sections, flavours, loading and validation.

Each family's config class lives in its folder (rgpt_dist/models/<family>/config.py); the registered
ones are also reachable here by class name (`from rgpt_dist.config import RecurrentGPTConfig`).
"""
from rgpt_dist.config.experiment import Config, load_config
from rgpt_dist.config.train import TrainConfig
from rgpt_dist.models.config import LoopedConfig, ModelConfig
from rgpt_dist.models.flavours import DENSE_REFERENCE, FLAVOURS, flavour
from rgpt_dist.sections import ConfigError, Section, field_docs, from_dict


def __getattr__(name: str):
    """A registered family's config class by its class name (looked up lazily: the families import
    this package)."""
    for cls in ModelConfig.variants().values():
        if cls.__name__ == name:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Config", "ConfigError", "DENSE_REFERENCE", "FLAVOURS", "LoopedConfig", "ModelConfig", "Section",
           "TrainConfig", "field_docs", "flavour", "from_dict", "load_config"]
