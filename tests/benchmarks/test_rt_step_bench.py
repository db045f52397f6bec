"""benchmarks/rt_step.py's smoke run: every model builds and steps, the table holds the three models with
their FLOP ratios (the RT's executed FLOPs above the same-shape dense model's by the persistent pair's
K and V), and bad arguments exit with status 2."""
import re

from benchmarks.rt_step import main


def test_rt_step_quick_prints_the_three_models_and_their_ratios(capsys):
    assert main(["--quick"]) == 0
    out = capsys.readouterr().out
    rows = {m.group(1): m.groups() for m in re.finditer(r"^\| (dense 4x256|RT 4x256|RT 2x360) \| ([\d,]+) \|.*\| "
                                                         r"([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", out, re.M)}
    assert set(rows) == {"dense 4x256", "RT 4x256", "RT 2x360"}
    assert rows["dense 4x256"][2:] == ("1.00", "1.000", "1.00")
    assert rows["RT 4x256"][1] == rows["dense 4x256"][1]  # equal parameters
    assert 1.1 < float(rows["RT 4x256"][3]) < 1.2  # + 4 d^2 per token and layer, less the causal half of the scores


def test_rt_step_bad_argument_exits_2(capsys):
    assert main(["--rounds", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err
