"""rgpt_dist/parallel/universal.py without DeepSpeed's conversion itself (tests/train/test_layout_change.py
runs that): what each layout change is called, which ones DeepSpeed cannot convert, and the slicing
declared per parameter."""
import pytest
import torch

from rgpt_dist.durable import UnsafePath
from rgpt_dist.parallel.universal import convert, layout_change, universal_info


@pytest.mark.parametrize("then,now,problem", [
    ((2, 1), (2, 1), None), ((1, 2), (2, 1), None), ((2, 2), (1, 1), None), ((3, 1), (3, 1), None),
    ((2, 1), (3, 1), "between ZeRO-1 and ZeRO-2 only"), ((3, 1), (1, 1), "between ZeRO-1 and ZeRO-2 only"),
    ((3, 1), (3, 2), "tp = 1 only"), ((0, 1), (2, 1), "ZeRO-0 keeps no partitioned optimizer state"),
    ((2, 1), (0, 1), "ZeRO-0 keeps no partitioned optimizer state")])
def test_layout_change_names_the_change_and_what_deepspeed_cannot_convert(tmp_path, then, now, problem):
    tag = tmp_path / "step_00000004"
    tag.mkdir()
    for rank in range(2):  # written by 2 data-parallel ranks (ZeRO-0 writes no such files: any dp reads it)
        if then[0]:
            (tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
    saved = {"parallel": {"zero_stage": then[0], "tp_size": then[1]}}
    change, why = layout_change(saved, tag, now[0], now[1], dp=2)
    if then == now:
        assert (change, why) == (None, None)
        return
    assert change == f"ZeRO-{then[0]}, tp = {then[1]}, dp = 2 -> ZeRO-{now[0]}, tp = {now[1]}, dp = 2"
    assert (why is None) == (problem is None) and (problem is None or problem in why), why
    assert layout_change(saved, tag, now[0], now[1], dp=1)[0].endswith("dp = 1")  # and the dp size itself


def test_universal_info_declares_row_splits_and_replicated_parameters_by_exact_name():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    layout = {"0.weight": 1, "0.bias": None, "1.weight": None, "1.bias": None, "2.weight": 0}  # 2.*: not a parameter
    info = universal_info(model, layout)
    assert info["parameter_with_row_parallelism_patterns"] == [r"^0\.weight$"]
    assert info["tp_replicated_parameter_patterns"] == [r"^0\.bias$", r"^1\.weight$", r"^1\.bias$"]


def test_a_link_planted_where_the_conversion_goes_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "universal").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePath, match="symbolic link"):
        convert(tmp_path / "step_00000004", tmp_path / "universal" / "step_00000004")
    assert not any((tmp_path / "elsewhere").iterdir())
