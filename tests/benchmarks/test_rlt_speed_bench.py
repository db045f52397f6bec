"""benchmarks/rlt_speed.py's smoke run (--quick: micro-batch 4, one round): the four models build at
the paper's width and step, the table holds them with their parameter counts, and both ratios are
held against the paper's (their outcome at this size is a timing, which unit tests do not judge:
docs/algorithmic.md has the measured runs); bad arguments exit with status 2."""
import re

import pytest

from benchmarks.rlt_speed import main


def test_rlt_speed_quick_steps_every_model_and_prints_both_ratios(capsys):
    assert main(["--quick"]) in (0, 1)  # 1: a ratio above the paper's, a timing
    out = capsys.readouterr().out
    params = {m.group(1): int(m.group(2).replace(",", "")) for m in
              re.finditer(r"^\| (RLT-1 4\+4|RLT-2 4\+4 B=4|RLT-0 4\+4|Transformer 8) \| ([\d,]+) \|", out, re.M)}
    assert len(params) == 4, out
    assert params["Transformer 8"] == 25_314_304  # docs/models.md: the RLT paper's 8-layer baseline
    assert params["RLT-1 4+4"] == params["RLT-2 4+4 B=4"] > params["RLT-0 4+4"]  # RLT-0: no feedback gate
    assert len(re.findall(r"steps are [\d.]+x as fast as RLT-1 .* (meets|MISSES) the bar", out)) == 2, out


def test_rlt_speed_bad_argument_exits_2(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--rounds", "0"])
    assert done.value.code == 2 and "must be a positive integer" in capsys.readouterr().err
