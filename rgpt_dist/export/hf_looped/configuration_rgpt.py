"""Hugging Face configuration of an exported prelude/core/coda model (RecurrentGPT, heavy-tail
Poisson, RRT, MoR, Ouro) or of a model without a recurrence depth that ships its own code (RLT, RT),
loaded with `trust_remote_code=True`. Self-contained: imports only `transformers`.

It carries the native model section's fields as attributes under their native names (listed in
`native_fields`), so the shipped native model modules read it as they read their own config, plus
inference settings, overridable at load:

    AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, r_eval=8, kv_strategy="average")

r_eval: the recurrence depth R* (default R; at most `max_eval_depth` where the family has one, e.g.
RRT's adapters end at R). kv_strategy: full | first | last | average (those the family's cache
offers, `kv_strategies`: Mixture-of-Recursions caches `full` only). The standard names other tools
read (hidden_size, num_attention_heads, max_position_embeddings, n_positions, num_hidden_layers) are
derived from the fields and kept in step with them; values for them in a config.json are ignored.
num_hidden_layers counts the blocks one forward executes at r_eval (n_pre + n_rec * r_eval + n_coda).

A model without a recurrence depth (RLT, RT) has none of the layout fields n_pre, n_rec, n_coda, n_loops
(a looped model has all four): r_eval is then None and setting it (or num_steps) is refused, and
num_hidden_layers is the value rgpt-export wrote (the family's blocks per token: RLT n_enc + n_dec, RT n_layer),
an integer >= 1, not derived.
"""
from __future__ import annotations

import operator

from transformers import PretrainedConfig

KV_STRATEGIES = ("full", "first", "last", "average")
_DERIVED = ("hidden_size", "num_attention_heads", "max_position_embeddings", "n_positions", "num_hidden_layers")
_WIDTH = ("d_model", "n_head", "block_size")               # -> hidden_size, heads, positions
_LAYERS = ("n_pre", "n_rec", "n_coda", "r_eval")             # -> num_hidden_layers (looped models)
_STRUCTURE = {"vocab_size": 1, "pad_vocab_multiple": 1, "block_size": 1, "d_model": 1, "n_head": 1}
"""Integer fields every exported family has -> their minimum."""
_DEPTH = {"n_rec": 1, "n_loops": 1, "n_pre": 0, "n_coda": 0}
"""A looped family's layout fields -> their minimum: all present (a recurrence depth) or none (RLT)."""


def check_r_eval(value, deepest=None) -> int:
    try:
        depth = None if isinstance(value, bool) else operator.index(value)  # ints, numpy / torch integers
    except TypeError:
        depth = None
    if depth is None or depth < 0:
        raise ValueError(f"r_eval (the inference recurrence depth R*) must be an integer >= 0, got {value!r}")
    if deepest is not None and depth > deepest:
        raise ValueError(f"r_eval={depth}: this model has no depth beyond {deepest}")
    return depth


MAX_DEPTH_FACTOR, MAX_LOOPS = 16, 1024
"""r_eval is at most 16 x the trained depth R (n_loops, itself <= 1024 as in training) or the family's
max_eval_depth, whichever is lower: one forward runs r_eval recurrence steps, so a crafted config.json
(r_eval = 10**9) must not make a load-and-generate run for ever (rgpt-dist docs/security.md)."""


def deepest(fields: dict):
    """The deepest r_eval a config with these attributes allows (None before n_loops is set)."""
    bounds = [fields.get("max_eval_depth"), fields.get("n_loops") and MAX_DEPTH_FACTOR * fields["n_loops"]]
    bounds = [b for b in bounds if isinstance(b, int) and not isinstance(b, bool)]
    return min(bounds) if bounds else None


def check_kv_strategy(value, supported=None) -> str:
    """supported: the strategies this family's cache offers (None: all)."""
    if value not in KV_STRATEGIES:
        raise ValueError(f"kv_strategy must be one of {', '.join(KV_STRATEGIES)}, got {value!r}")
    if supported is not None and value not in supported:
        raise ValueError(f"kv_strategy={value!r}: this model's cache offers {', '.join(supported)} only")
    return value


class RGPTConfig(PretrainedConfig):
    """The native model section (family, widths, the layout n_pre + n_rec x R + n_coda, the family's
    own fields) and the inference settings."""

    model_type = "rgpt_dist"
    keys_to_ignore_at_inference = ["past_key_values"]
    has_no_defaults_at_init = True  # the native fields have no defaults: a config always names its model

    def __init__(self, native_fields: list | None = None, r_eval: int | None = None, kv_strategy: str = "full",
                 max_eval_depth: int | None = None, kv_strategies: list | None = None, bos_token_id: int = 50256, eos_token_id: int = 50256,
                 use_cache: bool = True, **kwargs):
        layers = kwargs.get("num_hidden_layers")  # kept only without a depth (module docstring)
        for name in _DERIVED:  # derived below; a stale copy from a config.json must not win
            kwargs.pop(name, None)
        self.native_fields = list(native_fields or [])
        required = list(_STRUCTURE) + ["family"] + (list(_DEPTH) if self.has_depth else [])
        missing = [f for f in required if f not in self.native_fields or f not in kwargs]
        if missing:
            raise ValueError(f"invalid RGPTConfig: the native model fields {missing} are missing")
        for name in self.native_fields:
            setattr(self, name, kwargs.pop(name))
        if not self.has_depth:
            self.num_hidden_layers = layers
        self.max_eval_depth = max_eval_depth
        self.kv_strategies = None if kv_strategies is None else list(kv_strategies)
        self.kv_strategy = kv_strategy
        self.use_cache = use_cache
        self._check_structure()
        self.r_eval = r_eval
        super().__init__(bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)

    def __setattr__(self, key, value):
        # Validates the inference settings however they are set: in __init__, by a load-time override
        # (PretrainedConfig.from_dict applies those with setattr after __init__) or by hand.
        if key == "r_eval" and not self.has_depth:
            value = self._no_depth(value, "r_eval")
        elif key == "r_eval":
            value = self.__dict__.get("n_loops") if value is None else value
            value = check_r_eval(value, deepest(self.__dict__))
        elif key == "kv_strategy":
            value = check_kv_strategy(value, self.__dict__.get("kv_strategies"))
        super().__setattr__(key, value)
        d = self.__dict__
        if key in _WIDTH and all(k in d for k in _WIDTH):
            super().__setattr__("hidden_size", d["d_model"])
            super().__setattr__("num_attention_heads", d["n_head"])
            super().__setattr__("max_position_embeddings", d["block_size"])
            super().__setattr__("n_positions", d["block_size"])
        if key in _LAYERS and all(k in d for k in _LAYERS) and self.has_depth:
            super().__setattr__("num_hidden_layers", d["n_pre"] + d["n_rec"] * d["r_eval"] + d["n_coda"])

    @property
    def has_depth(self) -> bool:
        """Whether the model has a recurrence depth (any of n_pre, n_rec, n_coda, n_loops: all are then
        required); False for RLT."""
        return any(f in self.__dict__.get("native_fields", ()) for f in _DEPTH)

    def _no_depth(self, value, name: str) -> None:
        if value is not None:
            raise ValueError(f"{name}={value!r}: this model (family {self.__dict__.get('family')!r}) has no "
                             f"recurrence depth; leave r_eval and num_steps unset")
        return None

    def depth(self, value=None):
        """The depth a forward runs: `value` (num_steps, validated) or r_eval; None for a model without
        a depth, where a value is refused."""
        if not self.has_depth:
            return self._no_depth(value, "num_steps")
        return check_r_eval(self.r_eval if value is None else value, self.max_eval_depth)

    def _check_structure(self) -> None:
        bounds = {**_STRUCTURE, **(_DEPTH if self.has_depth else {"num_hidden_layers": 1})}
        problems = [f"{name}={getattr(self, name)!r} must be an integer >= {low}" for name, low in bounds.items()
                    if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int)
                    or getattr(self, name) < low]
        if not problems and self.has_depth and self.n_loops > MAX_LOOPS:
            problems.append(f"n_loops={self.n_loops} must be <= {MAX_LOOPS}")
        if not problems and self.d_model % self.n_head:
            problems.append(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if problems:
            raise ValueError("invalid RGPTConfig: " + "; ".join(problems))

    def validate_inference(self) -> None:
        """Re-checks every field (the model calls this, so a bad value set after __init__ still fails)."""
        self._check_structure()
        if self.has_depth:
            check_r_eval(self.r_eval, deepest(self.__dict__))
        else:
            self._no_depth(self.r_eval, "r_eval")
        check_kv_strategy(self.kv_strategy, self.kv_strategies)

    # what the native model reads besides its fields (rgpt_dist.models.config.ModelConfig has the same)
    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // self.pad_vocab_multiple) * self.pad_vocab_multiple

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head
