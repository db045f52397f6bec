"""The top-level config: sections, loading (YAML + flavours + overrides) and the one validate()."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from rgpt_dist.config.run import CheckpointConfig, DataConfig, EvalConfig, LogConfig, ParallelConfig
from rgpt_dist.config.train import TrainConfig
from rgpt_dist.data.suites import pairing_problem, suite_of_task
from rgpt_dist.models.config import MAX_BLOCKS, ModelConfig
from rgpt_dist.models.flavours import FLAVOURS, flavour
from rgpt_dist.models.spec import spec_for
from rgpt_dist.sections import (ConfigError, Section, apply_overrides, from_dict, nonfinite_fields, parse_override,
                                read_yaml)


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
        """Every problem of every section and between sections: the one validation place. Each
        section bounds its own fields (the bounds are in the field docstrings); here are added the
        non-finite floats of any section (family fields included) and the model's block count."""
        out = []
        for name in ("model", "train", "data", "parallel", "checkpoint", "eval", "log"):
            out += getattr(self, name).problems(name)
            out += nonfinite_fields(getattr(self, name), name)
        out += self._tensor_parallel_problems()
        out += self._family_problems()
        out += self._block_count_problems()
        if self.train.seq_len > self.model.block_size:
            out.append(f"train.seq_len={self.train.seq_len} exceeds model.block_size={self.model.block_size}")
        out += self._task_problems()
        if self.checkpoint.keep_best and not self.eval.every_steps:
            out.append("checkpoint.keep_best=true needs evaluations to select from: set eval.every_steps > 0 "
                       f"(got {self.eval.every_steps})")
        return list(dict.fromkeys(out))

    def _task_problems(self) -> list[str]:
        """With data.task: a task of the model's suite, and what the suite asks of the rest of the
        config (TaskSuite.config_problems: the algorithmic tasks' sequence length and vocabulary)."""
        if not self.data.task:
            return []

        try:
            wanted = spec_for(self.model).task_suite
        except (ValueError, TypeError, AttributeError):  # an unknown family: its own check reports it
            return []
        suite = suite_of_task(self.data.task)
        if suite is None:  # unknown (DataConfig reports it)
            return []
        problem = pairing_problem(self.data.task, wanted)
        if problem:
            return [f"data.task={self.data.task!r} with model.family={self.model.family!r}: {problem}"]
        return suite.config_problems(self)

    def _family_problems(self) -> list[str]:
        """What the model's family declares it cannot run (FamilySpec.run_problems: RLT refuses
        tensor parallelism), before any process group starts."""
        try:
            spec = spec_for(self.model)
        except (ValueError, TypeError, AttributeError):  # an unknown family: its own check reports it
            return []
        return spec.run_problems(self)

    def _block_count_problems(self) -> list[str]:
        """At most MAX_BLOCKS unique transformer blocks, whatever fields the family counts them in
        (gpt2: n_layer; looped families: n_pre + n_rec + n_coda)."""
        try:
            spec = spec_for(self.model)
            blocks = spec.unique_blocks(self.model)
        except (ValueError, TypeError, AttributeError):  # an unknown family: its own check reports it
            return []
        if isinstance(blocks, int) and blocks > MAX_BLOCKS:
            return [f"model: {blocks} transformer blocks ({spec.layout(self.model)}) exceed the bound of {MAX_BLOCKS}"]
        return []

    def _tensor_parallel_problems(self) -> list[str]:
        """Every split dimension must divide by parallel.tp_size."""
        tp, m = self.parallel.tp_size, self.model
        if tp <= 1:
            return [] if tp == 1 else [f"parallel.tp_size={tp} must be >= 1"]
        out = [f"model.{k}={v} is not divisible by parallel.tp_size={tp}" for k, v in
               (("n_head", m.n_head), ("d_model", m.d_model)) if v % tp]
        if isinstance(m.d_ff, int) and m.d_ff > 0 and m.d_ff % tp:  # the MLP's hidden features are split too
            out.append(f"model.d_ff={m.d_ff} is not divisible by parallel.tp_size={tp}")
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


DEFAULT_FLAVOUR = "gpt2-small"


@dataclasses.dataclass
class _ModelLayers:
    """The model section as three layers, merged in this order whatever order they were given in:
    a flavour (the last one named at any level), the YAML's own model fields, the command line's.
    A YAML model mapping without `flavour` is a complete section: a flavour named on the command
    line replaces it (with its fields)."""

    flavour: str | None = None
    flavour_from: str = "the default"
    replaced: str | None = None  # "NAME (where)" of the flavour the last one replaced
    fields: dict[str, tuple[Any, str]] = dataclasses.field(default_factory=dict)  # key -> (value, where)
    complete: str | None = None  # where a complete section (a mapping without flavour) came from

    def set_flavour(self, name: Any, where: str) -> None:
        if not isinstance(name, str):
            raise ConfigError(f"model={name!r} ({where}) must name a flavour (known: {', '.join(FLAVOURS)})")
        if self.flavour is not None and self.flavour != name:
            self.replaced = f"{self.flavour} ({self.flavour_from})"
        if self.complete is not None:  # a complete section gives way to the flavour, fields and all
            self.fields = {k: v for k, v in self.fields.items() if v[1] != self.complete}
            self.complete = None
        self.flavour, self.flavour_from = name, where

    def add(self, section: Any, where: str) -> None:
        """A model value from one level: a flavour name, or a mapping (with or without `flavour`)."""
        if isinstance(section, dict):
            section = dict(section)
            if "flavour" in section:
                self.set_flavour(section.pop("flavour"), where)
            elif self.flavour is None:
                self.complete = where
            self.fields.update({k: (v, where) for k, v in section.items()})
        else:
            self.set_flavour(section, where)

    def merge(self) -> dict[str, Any]:
        """The model mapping; a field the chosen family lacks names the field and both flavours."""
        name = self.flavour or (None if self.fields else DEFAULT_FLAVOUR)
        base = flavour(name) if name else {}
        data = {**base, **{k: v for k, (v, _) in self.fields.items()}}
        cls = ModelConfig.variants().get(data.get("family"))
        if cls is None or name is None:
            return data
        known = {f.name for f in dataclasses.fields(cls)}
        stray = [f"model.{k}={v!r} ({where}) is not a field of {cls.__name__} (family {data['family']!r}): the model "
                 f"is flavour {name} ({self.flavour_from})" + (f", which replaced {self.replaced}" if self.replaced else "")
                 for k, (v, where) in self.fields.items() if k not in known]
        if stray:
            raise ConfigError(stray)
        return data


def _split_model_overrides(overrides: list[str] | tuple[str, ...]) -> tuple[list[tuple[list[str], Any]], list[str]]:
    """(parsed model overrides, the other override strings)."""
    model, rest = [], []
    for text in overrides:
        keys, value = parse_override(text)
        if keys[0] == "model":
            model.append((keys, value))
        else:
            rest.append(text)
    return model, rest


def _exists(source: str | Path) -> bool:
    """Path.exists, with a name the OS refuses (too long) reported as a ConfigError, not raised."""
    try:
        return Path(source).exists()
    except (OSError, ValueError) as e:
        raise ConfigError(f"config {str(source)[:200]!r} cannot be looked up: {e}") from None


def load_config(source: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build and validate a Config.

    `source` is an experiment YAML, a model-section YAML (one with a top-level `family`), a flavour
    name, or None (the defaults). `overrides` are `key=value` strings applied in order, e.g.
    `model=recurrentgpt-debug model.n_loops=4 train.seq_len=128`. The model section is layered (see
    `_ModelLayers`): `model=NAME` or `model.flavour=NAME` on the command line rebuilds it from that
    flavour, family included, then applies the YAML's own model fields, then the command line's.
    """
    data: dict[str, Any] = {}
    where = "the config"
    if source is not None:
        if str(source) in FLAVOURS:
            data, where = {"model": str(source)}, "the named config"
        elif Path(source).suffix in (".yaml", ".yml") or _exists(source):
            data, where = read_yaml(source), Path(source).name
            if "family" in data:  # a model-section file such as configs/models/gpt2-small.yaml
                data = {"model": data}
        else:
            raise ConfigError(f"config {str(source)!r} is neither a YAML file nor a flavour "
                              f"(flavours: {', '.join(FLAVOURS)})")
    layers = _ModelLayers()
    if "model" in data:
        layers.add(data.pop("model"), where)
    model_overrides, rest = _split_model_overrides(overrides)
    for keys, value in model_overrides:
        if len(keys) == 1:
            layers.add(value, "command line")
        elif keys[1:] == ["flavour"]:
            layers.set_flavour(value, "command line")
        elif len(keys) == 2:
            layers.fields[keys[1]] = (value, "command line")
        else:
            raise ConfigError(f"override model.{'.'.join(keys[1:])}: model fields are not nested")
    data = apply_overrides(data, rest)
    data["model"] = layers.merge()
    return from_dict(Config, data).validate()
