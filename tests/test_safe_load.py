"""rgpt_dist.safe_load: checkpoint files load without running the code they name."""
import types

import pytest
import torch

from rgpt_dist.safe_load import UntrustedCheckpoint, load_pt, restricted_loads, scan_pt
from tests.helpers.hostile import Payload


def test_a_payload_is_refused_naming_the_file_and_fires_only_when_trusted(tmp_path):
    marker, evil = tmp_path / "fired", tmp_path / "evil.pt"
    torch.save({"w": torch.ones(3), "x": Payload(marker)}, evil)
    with pytest.raises(UntrustedCheckpoint, match=r"evil\.pt: refusing to load: it asks to import (io|builtins)\.open"):
        load_pt(evil)
    assert ".open" in scan_pt(evil)
    assert not marker.exists()
    load_pt(evil, trust=True)  # the payload is real: trusting the file runs it
    assert marker.exists()


def test_tensors_and_deepspeed_records_load(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    path = tmp_path / "ok.pt"
    torch.save({"w": torch.arange(4.0), "scaler": LossScaler(1.0), "stage": ZeroStageEnum.gradients,
                "shape": torch.Size([2, 2])}, path)
    assert scan_pt(path) is None
    state = load_pt(path)
    assert torch.equal(state["w"], torch.arange(4.0)) and state["stage"] == ZeroStageEnum.gradients
    assert isinstance(state["scaler"], LossScaler)


@pytest.mark.parametrize("content", [b"", b"not a checkpoint", b"PK\x03\x04" + b"\x00" * 40])
def test_unreadable_bytes_are_a_clean_refusal(tmp_path, content):
    path = tmp_path / "junk.pt"
    path.write_bytes(content)
    with pytest.raises(UntrustedCheckpoint, match="junk.pt: not a readable checkpoint"):
        load_pt(path)
    assert scan_pt(path) is not None


def test_restricted_loads_swaps_only_that_modules_torch(tmp_path):
    marker, evil = tmp_path / "fired", tmp_path / "evil.pt"
    torch.save({"x": Payload(marker)}, evil)
    module = types.ModuleType("third_party")
    module.torch = torch
    with restricted_loads(module):
        assert module.torch.float32 is torch.float32  # everything else is torch's
        with pytest.raises(UntrustedCheckpoint):
            module.torch.load(evil, weights_only=False)  # what DeepSpeed's readers pass
        assert torch.load is not module.torch.load
    assert module.torch is torch and not marker.exists()
