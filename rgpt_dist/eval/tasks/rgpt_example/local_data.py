"""`custom_dataset` loader for the bundled lm-eval tasks: JSON Lines files named relative to the task YAML.

lm-eval 0.4.13 hands `dataset_kwargs` to `datasets.load_dataset` unchanged, so a relative `data_files`
entry would be resolved against the *current working directory*. A task YAML instead names this
function as its `custom_dataset` (`!function local_data.load_local_jsonl`, imported from the YAML's own
folder); lm-eval calls it with the task metadata (which holds `config_source`, the YAML's absolute path)
and the YAML's `dataset_kwargs`. Relative paths are resolved against the YAML's folder, so the task works
from any cwd, offline: the rows are read with `json` and wrapped in an in-memory `datasets.Dataset`
(no Hub access, no cache directory).
"""
from __future__ import annotations

import json
from pathlib import Path


def resolve_data_files(data_files, base_dir: str | Path) -> dict[str, list[Path]]:
    """{split: [absolute paths]} from a str, a list or a {split: str | list} mapping (split 'train'
    for the first two, as `datasets.load_dataset` does); relative entries are taken from `base_dir`."""
    if data_files is None:
        raise ValueError("the task's dataset_kwargs.data_files is missing")
    if isinstance(data_files, (str, Path)) or isinstance(data_files, (list, tuple)):
        data_files = {"train": data_files}
    out = {}
    for split, files in dict(data_files).items():
        files = [files] if isinstance(files, (str, Path)) else list(files)
        paths = []
        for f in files:
            p = Path(f).expanduser()
            p = p if p.is_absolute() else Path(base_dir) / p
            if not p.is_file():
                raise FileNotFoundError(f"data file for split {split!r} not found: {p}")
            paths.append(p.resolve())
        out[str(split)] = paths
    return out


def read_jsonl(path: str | Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None
    return rows


def load_local_jsonl(data_files=None, config_source: str | None = None, **_metadata):
    """A `datasets.DatasetDict` {split: Dataset} from local JSON Lines files (see the module docstring).
    Extra metadata lm-eval passes (version, model_args entries, ...) is ignored."""
    import datasets  # lm-eval's task file: datasets only when the task loads

    base = Path(config_source).parent if config_source and config_source != "inline" else Path(__file__).parent
    splits = resolve_data_files(data_files, base)
    return datasets.DatasetDict({
        split: datasets.Dataset.from_list([row for p in paths for row in read_jsonl(p)])
        for split, paths in splits.items()
    })
