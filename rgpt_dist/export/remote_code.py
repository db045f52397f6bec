"""Whether to let `transformers` run the Python code an exported model directory ships, and whether the
directory can be loaded at all without transformers reaching code or files outside it.

A looped family's (or RLT's) Hugging Face export carries its model code (`auto_map` in config.json), which
`trust_remote_code=True` imports and runs; a dense GPT-2 export needs none. An export can come from
anyone, so the code is trusted by policy, never by default:

    auto    (default) no remote code for exports that need none; for one that ships code, only when
            every .py file in it is byte-identical to what this checkout's rgpt-export writes for
            its family (so the code that runs is the code you have); otherwise refused, naming the
            files that differ
    never   refuse any export that ships code
    trust   UNSAFE: run whatever code the export ships (an export you wrote with another version);
            nothing below is checked

Under auto and never, transformers' from_pretrained (config, tokenizer, model) must find nothing but the
files rgpt-export writes, so that the code and files checked here are the ones it loads. Found in
transformers 4.57's loading code, each refused with the file and key it lives in:
- adapter_config.json (peft): the model is loaded from its base_model_name_or_path instead, with that
  directory's or repository's auto_map code;
- custom_generate/generate.py: imported for any local directory, whatever trust_remote_code says;
- auto_map other than exactly ours, in config.json or tokenizer_config.json ("DIR--module.Class" and
  "owner/repo--module.Class" import code from another directory or repository);
- config.json's configuration_files (another config.<version>.json is read in place of config.json),
  transformers_weights (the weights file, joined to the directory: "../" leaves it), custom_pipelines,
  _name_or_path, base_model_name_or_path, quantization_config, and a model_type other than ours;
- tokenizer_config.json keys ending in _file/_files (tokenizer_file is read in place of the export's
  tokenizer.json from any path; fast_tokenizer_files' names are joined to the directory);
- model.safetensors.index.json weight_map values other than this directory's shard files;
- links (followed by every reader), subdirectories, FIFOs and devices, and any file rgpt-export does
  not write (pickled weights, processor configs with their own auto_map, ...).
JSON is parsed, not searched as text (`"auto\\u005fmap"` is the key auto_map to transformers).
The loader (rgpt_dist.eval.harness.hf_model_args) also passes local_files_only and use_safetensors.
Code trusted under auto runs the model config.json describes: rgpt_dist.export.config_bounds first
refuses sizes the weights on disk do not hold (300,000 layers, d_model 2^22; ConfigBoundsRefused).
"""
from __future__ import annotations

import json
import os
import re
import reprlib
import tempfile
from pathlib import Path

from rgpt_dist.export.config_bounds import check_config_bounds
from rgpt_dist.export.hf_looped_writer import AUTO_MAP, WRITER, write_code
from rgpt_dist.models.spec import families

POLICIES = ("auto", "never", "trust")

# what rgpt-export writes into hf/ besides the model code (.py files, compared with this checkout's own)
EXPORT_FILES = frozenset({"config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                          "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")  # save_pretrained's shards of a large dense model
# a model hub's metadata, which transformers never reads: an export downloaded from a hub keeps loading
HUB_FILES = frozenset({"README.md", ".gitattributes"})
HUB_CACHE_DIR = ".cache"  # huggingface_hub's download records (snapshot_download(local_dir=...))
WHY = {
    "adapter_config.json": "peft: transformers loads the model its base_model_name_or_path names, another "
                           "directory or repository with its own code, in place of this one",
    "custom_generate": "transformers imports custom_generate/generate.py when it loads a local model, even "
                       "without trust_remote_code",
}
CONFIG_KEYS = {
    "configuration_files": "transformers reads the config.<version>.json it lists in place of config.json",
    "transformers_weights": "transformers loads the weights file it names, joined to the directory",
    "custom_pipelines": "pipeline code, possibly from another repository",
    "_name_or_path": "names another directory or repository as the model's origin",
    "base_model_name_or_path": "peft: names another model to load",
    "quantization_config": "makes transformers load a quantizer and its kernels for the weights",
}
# config.json model types rgpt-export writes: GPT-2 and Llama / Qwen3 (dense) and the looped families' RGPTConfig; another
# type builds another architecture, some of which fetch more (e.g. a pretrained backbone) while loading
MODEL_TYPES = ("gpt2", "llama", "qwen3", "rgpt_dist")  # hf_dense, hf_llama, hf_looped
_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 160, 160, 3, 3


class RemoteCodeRefused(ValueError):
    """An export whose shipped code the policy does not let run, or that would make transformers load
    code or files from outside it."""


def _json(hf_dir: Path, name: str) -> dict:
    try:
        data = json.loads((hf_dir / name).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RemoteCodeRefused(f"{hf_dir}/{name} unreadable: {e}") from None
    if not isinstance(data, dict):
        raise RemoteCodeRefused(f"{hf_dir}/{name} is not a JSON object")
    return data


def _config(hf_dir: Path) -> dict:
    return _json(hf_dir, "config.json")


def _entries(hf_dir: Path) -> tuple[list[str], set[str]]:
    """(what in hf_dir transformers must not find, the names of its acceptable regular files), from one
    listing that follows no link and opens nothing (a FIFO would block the reader)."""
    problems, files = [], set()
    try:
        entries = sorted(os.scandir(hf_dir), key=lambda e: e.name)
    except OSError as e:
        raise RemoteCodeRefused(f"{hf_dir} unreadable: {e}") from None
    for entry in entries:
        name = entry.name
        if entry.is_symlink():
            problems.append(f"{name} (a symbolic link, to {os.readlink(entry.path)}: transformers would follow it)")
        elif entry.is_dir(follow_symlinks=False):
            if name != HUB_CACHE_DIR:
                why = WHY.get(name, "rgpt-export writes none; transformers reads subfolders such as custom_generate/")
                problems.append(f"{name}/ (a directory: {why})")
        elif not entry.is_file(follow_symlinks=False):
            problems.append(f"{name} (not a regular file)")
        elif name.endswith(".py") or name in EXPORT_FILES or name in HUB_FILES or SHARD.fullmatch(name):
            files.add(name)
        else:
            problems.append(f"{name} (not a file rgpt-export writes" + (f": {WHY[name]})" if name in WHY else ")"))
    return problems, files


def _key_problems(hf_dir: Path, files: set[str], config: dict) -> list[str]:
    """The keys of the export's JSON files that make transformers read something else than its files."""
    problems = [f"config.json key {k!r} = {_REPR.repr(config[k])} ({why})"
                for k, why in CONFIG_KEYS.items() if k in config]
    if config.get("model_type") not in MODEL_TYPES:
        problems.append(f"config.json key 'model_type' = {_REPR.repr(config.get('model_type'))} (rgpt-export "
                        f"writes {' or '.join(MODEL_TYPES)}; another type loads another architecture)")
    tokenizer = _json(hf_dir, "tokenizer_config.json") if "tokenizer_config.json" in files else {}
    problems += [f"tokenizer_config.json key {k!r} = {_REPR.repr(tokenizer[k])} (names a file transformers reads "
                 f"in place of the export's own tokenizer files)"
                 for k in sorted(tokenizer) if k.endswith(("_file", "_files"))]
    if "model.safetensors.index.json" in files:
        weight_map = _json(hf_dir, "model.safetensors.index.json").get("weight_map")
        names = set(weight_map.values()) if isinstance(weight_map, dict) else {weight_map}
        bad = sorted(str(v) for v in names if not (isinstance(v, str) and SHARD.fullmatch(v) and v in files))
        if bad or not names:
            problems.append(f"model.safetensors.index.json weight_map names {_REPR.repr(bad)} (only this "
                            f"directory's model-NNNNN-of-NNNNN.safetensors files may be named)")
    return problems


def foreign_code(hf_dir: Path, family: object) -> list[str]:
    """The .py files of hf_dir that are not exactly what this checkout writes for `family` (missing,
    extra or different; a link or anything but a regular file is never read); [] when the code is ours."""
    if not isinstance(family, str) or family not in families() or families()[family].hf_writer != WRITER:
        return [f"config.json family {family!r} (no such family with shipped code in this checkout)"]
    with tempfile.TemporaryDirectory() as tmp:
        write_code(family, Path(tmp))
        ours = {p.name: p.read_bytes() for p in Path(tmp).glob("*.py")}
    theirs = {p.name: p for p in hf_dir.iterdir() if p.suffix == ".py"}
    differ = [n for n in sorted(set(ours) | set(theirs))
              if n not in theirs or n not in ours or theirs[n].is_symlink() or not theirs[n].is_file()
              or theirs[n].read_bytes() != ours[n]]
    return differ


def _code(hf_dir: Path, files: set[str], config: dict) -> tuple[list[str], list[str]]:
    """(the code hf_dir ships, what of it is not exactly this checkout's)."""
    code, differ = [], []
    tokenizer = _json(hf_dir, "tokenizer_config.json") if "tokenizer_config.json" in files else {}
    if "auto_map" in tokenizer:  # rgpt-export ships no tokenizer code
        code.append("tokenizer_config.json auto_map")
        differ.append(f"tokenizer_config.json auto_map {_REPR.repr(tokenizer['auto_map'])} (tokenizer code)")
    py = sorted(n for n in files if n.endswith(".py"))
    if config.get("auto_map") or py:
        code += (["config.json auto_map"] if config.get("auto_map") else []) + py
        differ += foreign_code(hf_dir, config.get("family"))
        if config.get("auto_map") != AUTO_MAP:  # e.g. "other/repo--modeling.X": code from elsewhere
            differ.insert(0, f"config.json auto_map {_REPR.repr(config.get('auto_map'))}")
    return code, differ


def trust_remote_code(hf_dir: str | Path, policy: str = "auto") -> bool:
    """The `trust_remote_code` value to load hf_dir with under `policy`; RemoteCodeRefused when the
    export ships code the policy does not allow, or (auto, never) holds anything by which transformers
    would load code or files from outside it (module docstring); under auto, ConfigBoundsRefused when the
    code is ours but config.json asks for sizes the weights on disk do not hold (rgpt_dist.export.config_bounds)."""
    if policy not in POLICIES:
        raise ValueError(f"remote code policy {policy!r} is not one of {POLICIES}")
    hf_dir = Path(hf_dir)
    if policy == "trust":
        return bool(_config(hf_dir).get("auto_map"))
    problems, files = _entries(hf_dir)
    if "config.json" in files:  # only regular files are read (`files`), never a link or a FIFO
        problems += _key_problems(hf_dir, files, _config(hf_dir))
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise RemoteCodeRefused(
            f"{hf_dir}: refusing to load this export under --remote-code {policy}: {'; '.join(problems[:5])}{more}. "
            f"rgpt-export writes none of these, and each lets transformers load code or files other than the "
            f"checked export. Re-export the checkpoint with this checkout, or pass --remote-code trust (UNSAFE: "
            f"loads whatever the export names; see docs/security.md)")
    code, differ = _code(hf_dir, files, _config(hf_dir))
    if not code:
        return False  # a model transformers implements itself (dense GPT-2)
    if policy == "never":
        raise RemoteCodeRefused(f"{hf_dir} ships model code ({', '.join(code[:5])}) and --remote-code never refuses it")
    if differ:
        raise RemoteCodeRefused(
            f"{hf_dir} ships model code that is not this checkout's ({', '.join(differ[:5])}); refusing to "
            f"run it. Re-export the checkpoint with this checkout, or pass --remote-code trust (UNSAFE: "
            f"runs the export's code; see docs/security.md)")
    check_config_bounds(hf_dir)  # the code is ours, the config.json still the export's: sizes bounded by the weights
    return True
