"""A training checkpoint -> an export directory, written whole or not at all:

    OUT/native/   model.safetensors + config.json (rgpt-dist's own format, rgpt_dist.checkpoints.native)
    OUT/hf/       a Hugging Face model directory with the GPT-2 tokenizer files (an algorithmic task's run:
                  its task's tokenizer, rgpt_dist.export.tokenizer_files):
                  dense GPT-2 as a native GPT2LMHeadModel, RecurrentGPT as trust_remote_code
    OUT/export.json  where it came from (checkpoint, step, weights source, checksum record)

OUT is checked before the checkpoint is read (rgpt_dist.safe_paths): a file or a link there is refused,
and so is OUT being the run being exported, inside it or above it. --overwrite replaces only a previous
export (exactly export.json, native/, hf/, with a valid record) or an empty directory. The export is
written into a staging directory `.<OUT>.rgpt-export-XXXXXXXX` beside OUT; an interrupted export's one
is removed by the next export to the same OUT.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import torch

from rgpt_dist.durable import swap_dir
from rgpt_dist.checkpoints.consolidate import ExportError, consolidate
from rgpt_dist.checkpoints.native import write_native
from rgpt_dist.export.tokenizer_files import write_export_tokenizer
from rgpt_dist.models.spec import spec_for
from rgpt_dist.safe_paths import out_dir, refuse_overlap, remove_stale, seal, staging
from rgpt_dist.checkpoints.record import TAG_PREFIX

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


LAYOUT = {"export.json", "native", "hf"}
RECORD_KEYS = {"checkpoint", "step", "weights", "dtype", "checksums_sha256"}  # written by every rgpt-export


def export(checkpoint: str | Path, out: str | Path, *, overwrite: bool = False, dtype: str = "fp32",
           inference: dict | None = None, trust: bool = False) -> Path:
    """Consolidate the newest complete checkpoint under `checkpoint` and write OUT (see module doc).
    `inference`: settings the HF config carries for the family (RecurrentGPT: r_eval, kv_strategy).
    trust=True (UNSAFE) loads checkpoint files that need full unpickling. OUT is replaced (with
    --overwrite) in one exchange: it always holds either the old export or the new one."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}")
    given, out = out, check_out(checkpoint, out, overwrite)  # before any work: a refusal costs nothing
    remove_stale(out.parent, staging_prefix(out))  # an interrupted export's leftovers, even if this one fails
    c = consolidate(checkpoint, trust=trust)  # names and shapes already checked against the model
    spec = spec_for(c.config.model)
    if not spec.hf_writer:  # the export is whole or nothing: no native/ without hf/
        raise ExportError(f"{c.tag_dir}: {spec.refusal('hf_writer')}; nothing was written to {given}")
    meta = {**c.record(),
            "checksums_sha256": hashlib.sha256((c.tag_dir / "checksums.json").read_bytes()).hexdigest()}
    out.parent.mkdir(parents=True, exist_ok=True)
    with staging(out.parent, staging_prefix(out)) as tmp:
        write_native(c.state_dict, c.config.model, tmp / "native", DTYPES[dtype], meta)
        spec.write_hf(c.state_dict, c.config.model, tmp / "hf", dtype=DTYPES[dtype], **(inference or {}))
        write_export_tokenizer(tmp / "hf", c.config)  # the run's task's, or GPT-2's
        (tmp / "export.json").write_text(json.dumps({**meta, "dtype": dtype, "inference": inference or {}}, indent=2))
        seal(tmp)
        check_out(checkpoint, given, overwrite)  # again: OUT may have changed while the checkpoint was read
        swap_dir(tmp, out)
    return out


def staging_prefix(out: Path) -> str:
    """OUT's staging directories are `.<OUT's name>.rgpt-export-` + 8 random characters, beside OUT."""
    return f".{out.name}.rgpt-export-"


def run_dir(checkpoint: str | Path) -> Path:
    """The run a checkpoint path belongs to (run/, run/checkpoints/ and run/checkpoints/step_* -> run/),
    links resolved: the directory an export must stay out of."""
    path = Path(os.path.realpath(checkpoint))
    if path.name.startswith(TAG_PREFIX):
        path = path.parent
    return path.parent if path.name == "checkpoints" else path


def check_out(checkpoint: str | Path, out: str | Path, overwrite: bool) -> Path:
    """OUT resolved (rgpt_dist.safe_paths.out_dir), after refusing what it must not be (module doc)."""
    real = out_dir(out)
    refuse_overlap(Path(out), run_dir(checkpoint), "the run being exported")
    if os.path.lexists(real):
        if not overwrite:
            raise ExportError(f"{out} exists: pass --overwrite to replace it")
        _check_replaceable(Path(out), real)
    return real


def _check_replaceable(out: Path, real: Path) -> None:
    """--overwrite deletes OUT: only an empty directory or a previous export (exactly LAYOUT: a real
    export.json holding an rgpt-export record, real native/ and hf/ directories) may go."""
    entries = set(os.listdir(real))
    if not entries:
        return
    refuse = (f"{out} is not an rgpt-export directory: refusing to replace it with --overwrite (remove it "
              f"yourself or choose another OUT)")
    if entries != LAYOUT:
        other = sorted(entries - LAYOUT) or [f"no {n}" for n in sorted(LAYOUT - entries)]
        raise ExportError(f"{refuse}; it holds {', '.join(other[:5])}{', ...' if len(other) > 5 else ''}, an export "
                          f"holds only export.json, native/ and hf/")
    for name in ("native", "hf"):
        if not stat.S_ISDIR(os.lstat(real / name).st_mode):
            raise ExportError(f"{refuse}; {out / name} is not a directory")
    st = os.lstat(real / "export.json")
    record = None
    if stat.S_ISREG(st.st_mode) and st.st_size < 1 << 20:
        try:
            record = json.loads((real / "export.json").read_bytes())
        except (ValueError, OSError):
            pass
    if not isinstance(record, dict) or not RECORD_KEYS <= set(record):
        raise ExportError(f"{refuse}; {out / 'export.json'} is not an rgpt-export record")
