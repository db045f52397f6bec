"""Typed configuration (no torch import): sections, flavours, loading and validation."""
from rgpt_dist.config.base import ConfigError, Section, field_docs, from_dict
from rgpt_dist.config.experiment import Config, load_config
from rgpt_dist.config.flavours import DENSE_REFERENCE, FLAVOURS, flavour
from rgpt_dist.config.model import GPT2Config, ModelConfig, RecurrentGPTConfig
from rgpt_dist.config.train import TrainConfig

__all__ = ["Config", "ConfigError", "DENSE_REFERENCE", "FLAVOURS", "GPT2Config", "ModelConfig",
           "RecurrentGPTConfig", "Section", "TrainConfig", "field_docs", "flavour", "from_dict", "load_config"]
