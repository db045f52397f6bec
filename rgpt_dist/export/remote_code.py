"""Whether to let `transformers` run the Python code an exported model directory ships.

A looped family's Hugging Face export carries its model code (`auto_map` in config.json), which
`trust_remote_code=True` imports and runs; a dense GPT-2 export needs none. An export can come from
anyone, so the code is trusted by policy, never by default:

    auto    (default) no remote code for exports that need none; for one that ships code, only when
            every .py file in it is byte-identical to what this checkout's rgpt-export writes for
            its family (so the code that runs is the code you have); otherwise refused, naming the
            files that differ
    never   refuse any export that ships code
    trust   UNSAFE: run whatever code the export ships (an export you wrote with another version)
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

POLICIES = ("auto", "never", "trust")


class RemoteCodeRefused(ValueError):
    """An export whose shipped code the policy does not let run."""


def _config(hf_dir: Path) -> dict:
    try:
        config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RemoteCodeRefused(f"{hf_dir}/config.json unreadable: {e}") from None
    if not isinstance(config, dict):
        raise RemoteCodeRefused(f"{hf_dir}/config.json is not a JSON object")
    return config


def foreign_code(hf_dir: Path, family: object) -> list[str]:
    """The .py files of hf_dir that are not exactly what this checkout writes for `family` (missing,
    extra or different); [] when the code is ours."""
    from rgpt_dist.export.hf_looped_writer import write_code
    from rgpt_dist.models.spec import families

    if not isinstance(family, str) or family not in families() or not families()[family].recurrent:
        return [f"config.json family {family!r} (no such looped family in this checkout)"]
    with tempfile.TemporaryDirectory() as tmp:
        write_code(family, Path(tmp))
        ours = {p.name: p.read_bytes() for p in Path(tmp).glob("*.py")}
    theirs = {p.name: p for p in hf_dir.iterdir() if p.suffix == ".py"}
    differ = [n for n in sorted(set(ours) | set(theirs))
              if n not in theirs or n not in ours or theirs[n].is_symlink() or theirs[n].read_bytes() != ours[n]]
    return differ


def trust_remote_code(hf_dir: str | Path, policy: str = "auto") -> bool:
    """The `trust_remote_code` value to load hf_dir with under `policy`; RemoteCodeRefused when the
    export ships code the policy does not allow."""
    if policy not in POLICIES:
        raise ValueError(f"remote code policy {policy!r} is not one of {POLICIES}")
    hf_dir = Path(hf_dir)
    config = _config(hf_dir)
    if not config.get("auto_map"):
        return False  # a model transformers implements itself (dense GPT-2)
    if policy == "trust":
        return True
    if policy == "never":
        raise RemoteCodeRefused(f"{hf_dir} ships model code (auto_map) and --remote-code never refuses it")
    from rgpt_dist.export.hf_looped_writer import AUTO_MAP

    differ = foreign_code(hf_dir, config.get("family"))
    if config["auto_map"] != AUTO_MAP:  # e.g. "other/repo--modeling.X": code fetched from elsewhere
        differ.insert(0, f"config.json auto_map {config['auto_map']!r}")
    tokenizer_config = hf_dir / "tokenizer_config.json"
    if tokenizer_config.is_file() and "auto_map" in tokenizer_config.read_text(encoding="utf-8", errors="replace"):
        differ.insert(0, "tokenizer_config.json auto_map (tokenizer code)")
    if differ:
        raise RemoteCodeRefused(
            f"{hf_dir} ships model code that is not this checkout's ({', '.join(differ[:5])}); refusing to "
            f"run it. Re-export the checkpoint with this checkout, or pass --remote-code trust (UNSAFE: "
            f"runs the export's code; see docs/security.md)")
    return True
