"""Hugging Face configuration of an exported RecurrentGPT (loaded with `trust_remote_code=True`).

Self-contained: imports only `transformers`. Structural fields mirror rgpt_dist's RecurrentGPTConfig
(the native training config); `r_eval` and `kv_strategy` are inference settings, overridable at load:

    AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, r_eval=8, kv_strategy="average")

The standard names other tools read (hidden_size, num_attention_heads, max_position_embeddings,
n_positions, num_hidden_layers) are derived from the structural fields and kept in step with them;
values for them found in a config.json are ignored. num_hidden_layers counts the blocks one forward
executes at r_eval (n_pre + n_rec * r_eval + n_coda), which is also the K/V layer count of a `full` cache.
"""
from __future__ import annotations

import operator

from transformers import PretrainedConfig

KV_STRATEGIES = ("full", "first", "last", "average")
_DERIVED = ("hidden_size", "num_attention_heads", "max_position_embeddings", "n_positions", "num_hidden_layers")
_SOURCES = ("d_model", "n_head", "block_size", "n_pre", "n_rec", "n_coda", "r_eval")


def check_r_eval(value) -> int:
    try:
        depth = None if isinstance(value, bool) else operator.index(value)  # ints, numpy / torch integers
    except TypeError:
        depth = None
    if depth is None or depth < 0:
        raise ValueError(f"r_eval (the inference recurrence depth R*) must be an integer >= 0, got {value!r}")
    return depth


def check_kv_strategy(value) -> str:
    if value not in KV_STRATEGIES:
        raise ValueError(f"kv_strategy must be one of {', '.join(KV_STRATEGIES)}, got {value!r}")
    return value


class RecurrentGPTHFConfig(PretrainedConfig):
    """RecurrentGPT: n_pre prelude blocks, n_rec shared core blocks applied r_eval times through the
    gated recurrence, n_coda coda blocks, final LayerNorm, LM head tied to the token embedding."""

    model_type = "rgpt_recurrent"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size: int = 50257,
        padded_vocab_size: int | None = None,
        block_size: int = 1024,
        d_model: int = 768,
        n_head: int = 12,
        n_pre: int = 1,
        n_rec: int = 1,
        n_coda: int = 1,
        n_loops: int = 10,
        tau: float = 1.0,
        ln_eps: float = 1e-5,
        bias: bool = True,
        init_std: float = 0.02,
        gate_bias_init: float = 4.0,
        r_eval: int | None = None,
        kv_strategy: str = "full",
        bos_token_id: int = 50256,
        eos_token_id: int = 50256,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        **kwargs,
    ):
        for name in _DERIVED:  # derived below; a stale copy from a config.json must not win
            kwargs.pop(name, None)
        self.vocab_size = vocab_size
        self.padded_vocab_size = vocab_size if padded_vocab_size is None else padded_vocab_size
        self.block_size = block_size
        self.d_model = d_model
        self.n_head = n_head
        self.n_pre = n_pre
        self.n_rec = n_rec
        self.n_coda = n_coda
        self.n_loops = n_loops
        self.tau = tau
        self.ln_eps = ln_eps
        self.bias = bias
        self.init_std = init_std
        self.gate_bias_init = gate_bias_init
        self.kv_strategy = kv_strategy
        self.use_cache = use_cache
        self._check_structure()
        self.r_eval = n_loops if r_eval is None else r_eval
        super().__init__(bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)

    def __setattr__(self, key, value):
        # Validates the inference settings however they are set: in __init__, by a load-time override
        # (PretrainedConfig.from_dict applies those with setattr after __init__) or by hand.
        if key == "r_eval":
            value = self.__dict__.get("n_loops") if value is None else value
            value = check_r_eval(value)
        elif key == "kv_strategy":
            value = check_kv_strategy(value)
        super().__setattr__(key, value)
        if key in _SOURCES and all(k in self.__dict__ for k in _SOURCES):
            d = self.__dict__
            super().__setattr__("hidden_size", d["d_model"])
            super().__setattr__("num_attention_heads", d["n_head"])
            super().__setattr__("max_position_embeddings", d["block_size"])
            super().__setattr__("n_positions", d["block_size"])
            super().__setattr__("num_hidden_layers", d["n_pre"] + d["n_rec"] * d["r_eval"] + d["n_coda"])

    def _check_structure(self) -> None:
        problems = []
        for name in ("vocab_size", "padded_vocab_size", "block_size", "d_model", "n_head", "n_rec", "n_loops"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name}={value!r} must be an integer >= 1")
        for name in ("n_pre", "n_coda"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"{name}={value!r} must be an integer >= 0")
        if not problems:
            if self.d_model % self.n_head:
                problems.append(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
            if self.padded_vocab_size < self.vocab_size:
                problems.append(f"padded_vocab_size={self.padded_vocab_size} < vocab_size={self.vocab_size}")
        if not self.tau > 0:
            problems.append(f"tau={self.tau!r} must be > 0")
        if not self.ln_eps > 0:
            problems.append(f"ln_eps={self.ln_eps!r} must be > 0")
        if problems:
            raise ValueError("invalid RecurrentGPTHFConfig: " + "; ".join(problems))

    def validate_inference(self) -> None:
        """Re-checks every field (the model calls this, so a bad value set after __init__ still fails)."""
        self._check_structure()
        check_r_eval(self.r_eval)
        check_kv_strategy(self.kv_strategy)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head
