"""A native prelude/core/coda state dict (RecurrentGPT, heavy-tail Poisson, RRT, MoR, Ouro) or one of
a family without a recurrence depth that declares this writer (RLT, RT) -> a Hugging Face
`trust_remote_code` directory that runs the trainer's own model modules:

    out_dir/config.json            RGPTConfig (the native model section + inference settings, auto_map)
    out_dir/model.safetensors      the native parameter names under `model.`; a tied head stored once (as
                                   wte), an untied one under its own name (RT: embed.unembed)
    out_dir/configuration_rgpt.py  the adapter, copied from rgpt_dist/export/hf_looped/
    out_dir/cache_rgpt.py          (torch + transformers + the shipped modules only)
    out_dir/modeling_rgpt.py
    out_dir/<shipped modules>      the family's model module and what it imports (rgpt_dist.export.shipping)

Load with `AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True[, r_eval=.., kv_strategy=..])`.
Tokenizer files are written elsewhere.

What the adapter asks of a native model: `forward(idx, r=, cache=, mask=, positions=)` returning
`.logits`, `make_cache(strategy, r, store=)` (a KVCache whose per-token stores `store()` makes: the
adapter passes transformers' DynamicLayers), `embed.wte` and `head.wte` (a one-element list: embed.wte
when tied, else the family's own head matrix; config.json then says tie_word_embeddings false). A
family without a depth (its spec's `recurrent` False) takes r=None: its config then has none of
n_pre, n_rec, n_coda, n_loops, r_eval stays None and num_hidden_layers is the spec's blocks per token.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from rgpt_dist.models.config import ModelConfig
from rgpt_dist.export.shipping import ship
from rgpt_dist.models.spec import families, spec_for
from rgpt_dist.export.hf_looped.configuration_rgpt import RGPTConfig
from rgpt_dist.registry import build_model

WRITER = "rgpt_dist.export.hf_looped_writer:write_hf_looped"
"""A family spec's `hf_writer` naming this writer: its exports ship code (rgpt_dist.export.remote_code)."""
HF_CODE_DIR = Path(__file__).resolve().parent / "hf_looped"
CODE_FILES = ("configuration_rgpt.py", "cache_rgpt.py", "modeling_rgpt.py")
AUTO_MAP = {"AutoConfig": "configuration_rgpt.RGPTConfig", "AutoModelForCausalLM": "modeling_rgpt.RGPTForCausalLM"}


def hf_config(cfg: ModelConfig, *, r_eval: int | None = None, kv_strategy: str = "full",
              dtype: torch.dtype = torch.float32):
    """The exported model's RGPTConfig (validates r_eval against the family's deepest depth, or refuses
    it for a family without a depth, and kv_strategy)."""

    spec, fields = spec_for(cfg), cfg.to_dict()
    # without a depth num_hidden_layers is not derived: the blocks one forward runs (RLT: n_enc + n_dec)
    layers = {} if spec.recurrent else {"num_hidden_layers": int(spec.block_executions(cfg))}
    # an untied head (RT) says so to tools that read the standard key; tied exports keep their config.json
    untied = {} if getattr(cfg, "tie_embeddings", True) else {"tie_word_embeddings": False}
    config = RGPTConfig(native_fields=list(fields), r_eval=r_eval, kv_strategy=kv_strategy,
                        max_eval_depth=spec.max_eval_depth(cfg), kv_strategies=list(spec.kv_strategies),
                        **layers, **untied, **fields)
    config.architectures = ["RGPTForCausalLM"]
    config.auto_map = dict(AUTO_MAP)
    config.dtype = dtype
    return config


def _check_state_dict(state_dict: dict[str, torch.Tensor], cfg: LoopedConfig) -> None:
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in build_model(cfg).state_dict().items()}
    missing, unexpected = sorted(set(shapes) - set(state_dict)), sorted(set(state_dict) - set(shapes))
    wrong = sorted(f"{k}: {tuple(state_dict[k].shape)} != {shapes[k]}" for k in set(shapes) & set(state_dict)
                   if tuple(state_dict[k].shape) != shapes[k])
    if missing or unexpected or wrong:
        raise ValueError(f"state dict does not match the {cfg.family} config: "
                         f"missing {missing}, unexpected {unexpected}, wrong shapes {wrong}")


def write_hf_looped(state_dict: dict[str, torch.Tensor], cfg: ModelConfig, out_dir: Path, *,
                    r_eval: int | None = None, kv_strategy: str = "full", dtype: torch.dtype = torch.float32) -> Path:
    """Writes the HF directory for a native (tp = 1, consolidated) state dict; returns out_dir.
    r_eval: default inference depth R* (None = R = cfg.n_loops; must be None without a depth);
    kv_strategy: full|first|last|average (those the family offers); dtype: of the stored
    floating-point tensors."""
    spec = spec_for(cfg)
    if spec.hf_writer != WRITER:
        raise ValueError(f"write_hf_looped exports the families whose spec names it as hf_writer (prelude/core/coda "
                         f"models, RLT, RT), not {cfg.family!r} (its hf_writer: {spec.hf_writer or 'none'!r})")
    config = hf_config(cfg, r_eval=r_eval, kv_strategy=kv_strategy, dtype=dtype)
    _check_state_dict(state_dict, cfg)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in state_dict.items():  # each a fresh contiguous CPU copy (no shared storage)
        t = t.detach().to("cpu")
        tensors[f"model.{name}"] = (t.to(dtype) if t.is_floating_point() else t).clone(memory_format=torch.contiguous_format)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out_dir)
    write_code(cfg.family, out_dir)
    return out_dir


def write_code(family: str, out_dir: Path) -> list[str]:
    """The Python files of a `family` export (adapter + shipped native modules) into out_dir; returns
    their names. rgpt_dist.export.remote_code regenerates them to recognise an export's code as ours."""

    spec = families()[family]
    for name in CODE_FILES:
        shutil.copyfile(HF_CODE_DIR / name, Path(out_dir) / name)
    return sorted({*CODE_FILES, *ship(spec.model, spec.config, Path(out_dir))})
