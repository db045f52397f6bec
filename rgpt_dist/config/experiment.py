"""The top-level config: sections, loading (YAML + flavours + overrides) and the one validate()."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from rgpt_dist.config.base import ConfigError, Section, apply_overrides, from_dict, read_yaml
from rgpt_dist.config.flavours import FLAVOURS, flavour
from rgpt_dist.config.model import ModelConfig
from rgpt_dist.config.run import CheckpointConfig, DataConfig, EvalConfig, LogConfig, ParallelConfig
from rgpt_dist.config.train import TrainConfig


@dataclasses.dataclass
class Config(Section):
    """A whole experiment: every section is validated together before anything starts."""

    model: ModelConfig = dataclasses.field(default_factory=lambda: from_dict(ModelConfig, flavour("gpt2-small")))
    """The model: a mapping with `family`, or in YAML/overrides the name of a flavour."""
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    """Optimisation recipe and batch shape."""
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    """Training and validation data."""
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    """ZeRO stage, precision, activation checkpointing, tensor parallelism."""
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    """Checkpoint cadence, retention and resumption."""
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    """Validation cadence and the early-exit curve."""
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    """Run directory, metrics and wandb."""

    def problems(self, path: str = "") -> list[str]:
        out = []
        for name in ("model", "train", "data", "parallel", "checkpoint", "eval", "log"):
            out += getattr(self, name).problems(name)
        out += self._tensor_parallel_problems()
        if self.train.seq_len > self.model.block_size:
            out.append(f"train.seq_len={self.train.seq_len} exceeds model.block_size={self.model.block_size}")
        return out

    def _tensor_parallel_problems(self) -> list[str]:
        """Every split dimension must divide by parallel.tp_size."""
        tp, m = self.parallel.tp_size, self.model
        if tp <= 1:
            return [] if tp == 1 else [f"parallel.tp_size={tp} must be >= 1"]
        out = [f"model.{k}={v} is not divisible by parallel.tp_size={tp}" for k, v in
               (("n_head", m.n_head), ("d_model", m.d_model)) if v % tp]
        if m.padded_vocab_size % tp:
            out.append(f"the padded vocabulary {m.padded_vocab_size} (model.vocab_size={m.vocab_size}, "
                       f"model.pad_vocab_multiple={m.pad_vocab_multiple}) is not divisible by parallel.tp_size={tp}; "
                       f"use model.pad_vocab_multiple={128 * tp}")
        return out

    def validate(self) -> "Config":
        """Raise one ConfigError naming every offending value; return self when valid."""
        problems = self.problems()
        if problems:
            raise ConfigError(problems)
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def _expand_flavour(data: dict[str, Any]) -> dict[str, Any]:
    """`model: <flavour>` -> that flavour's mapping; `model: {flavour: <name>, key: value, ...}` ->
    the flavour with those fields replaced."""
    model = data.get("model")
    if isinstance(model, str):
        data = {**data, "model": flavour(model)}
    elif isinstance(model, dict) and "flavour" in model:
        rest = {k: v for k, v in model.items() if k != "flavour"}
        data = {**data, "model": {**flavour(model["flavour"]), **rest}}
    return data


def load_config(source: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build and validate a Config.

    `source` is an experiment YAML, a model-section YAML (one with a top-level `family`), a flavour
    name, or None (the defaults). `overrides` are `key=value` strings applied in order, e.g.
    `model=recurrentgpt-debug model.n_loops=4 train.seq_len=128`.
    """
    data: dict[str, Any] = {}
    if source is not None:
        if str(source) in FLAVOURS:
            data = {"model": str(source)}
        elif Path(source).suffix in (".yaml", ".yml") or Path(source).exists():
            data = read_yaml(source)
            if "family" in data:  # a model-section file such as configs/models/gpt2-small.yaml
                data = {"model": data}
        else:
            raise ConfigError(f"config {str(source)!r} is neither a YAML file nor a flavour "
                              f"(flavours: {', '.join(FLAVOURS)})")
    data = _expand_flavour(data)
    for text in overrides:
        data = _expand_flavour(apply_overrides(data, [text]))
    return from_dict(Config, data).validate()
