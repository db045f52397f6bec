"""rgpt_dist.checkpoints.source: what rgpt-eval reads from an export cannot point it at the reader's own
directory, and a damaged native export is a clean error."""
import json

import pytest
import torch

from rgpt_dist.config import GPT2Config
from rgpt_dist.checkpoints.source import load_model
from rgpt_dist.checkpoints.native import write_native
from rgpt_dist.registry import build_model

CFG = GPT2Config(vocab_size=300, block_size=32, d_model=32, n_head=4, n_layer=1)


@pytest.fixture
def export(tmp_path):
    out = tmp_path / "exports" / "x"
    meta = {"step": 3, "data": {"paths": ["ds", "/abs/ds", "s3://bucket/ds"], "val_split": "val"}}
    write_native(build_model(CFG, seed=0).state_dict(), CFG, out / "native", torch.float32, meta)
    return out


def test_relative_dataset_paths_resolve_against_the_export(export, tmp_path, monkeypatch):
    (tmp_path / "ds").mkdir()  # a same-named directory where rgpt-eval runs must not be picked
    monkeypatch.chdir(tmp_path)
    _, record = load_model(export)
    assert record["data"]["paths"] == [str(export.resolve() / "ds"), "/abs/ds", "s3://bucket/ds"]
    assert record["step"] == 3


@pytest.mark.parametrize("damage", ["not json", "[]", '{"format": "rgpt-dist/native/1"}', "model", "tensors"])
def test_a_damaged_native_export_is_a_clean_error(export, damage):
    config = export / "native" / "config.json"
    if damage == "model":  # sizes a crafted config could make absurd
        record = json.loads(config.read_text())
        record["model"]["d_model"] = 2**30
        config.write_text(json.dumps(record))
    elif damage == "tensors":
        (export / "native" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    else:
        config.write_text(damage)
    with pytest.raises(ValueError, match=r"native/(config\.json|model\.safetensors)"):
        load_model(export)
