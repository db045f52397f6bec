"""benchmarks/rlt_speed.py: its smoke run (--quick: 1 thread, micro-batch 2, one round) builds the four
models at the paper's width and steps them, the table holds them with their parameter counts, and
both chunked models are held against the margin bar with the paper's ratios beside them (the
outcome at this size is a timing, which unit tests do not judge: docs/algorithmic.md has the
measured runs and the bar failing on the slowed path); the slowed path (`--slow-path token`) is
exact and really token by token; bad arguments exit with status 2."""
import re

import pytest
import torch

from benchmarks.rlt_speed import token_by_token, main
from rgpt_dist.models.rlt.model import RLT
from tests.models.rlt.test_rlt_model import T, tiny_model, tokens


def test_rlt_speed_quick_steps_every_model_and_holds_both_chunked_models_to_the_bar(capsys):
    assert main(["--quick"]) in (0, 1)  # 1: a ratio under the margin, a timing
    out = capsys.readouterr().out
    params = {m.group(1): int(m.group(2).replace(",", "")) for m in
              re.finditer(r"^\| (RLT-1 4\+4|RLT-2 4\+4 B=4|RLT-0 4\+4|Transformer 8) \| ([\d,]+) \|", out, re.M)}
    assert len(params) == 4, out
    assert params["Transformer 8"] == 25_314_304  # docs/models.md: the RLT paper's 8-layer baseline
    assert params["RLT-1 4+4"] == params["RLT-2 4+4 B=4"] > params["RLT-0 4+4"]  # RLT-0: no feedback gate
    bars = re.findall(r"(RLT-[20]) 4\+4.* steps are [\d.]+x as fast as RLT-1 \(bar >= 1.2x: (PASS|FAIL); "
                      r"paper ([\d.-]+x), information only\)", out)
    assert sorted(b[0] for b in bars) == ["RLT-0", "RLT-2"], out
    assert {b[0]: b[2] for b in bars} == {"RLT-2": "2.27x", "RLT-0": "4.17-4.30x"}
    assert re.search(r"^(PASS|FAIL): the bar", out, re.M), out


@pytest.mark.parametrize("interval", [4, 0])  # RLT-2 (B = 4, a partial last chunk at T = 11), RLT-0
def test_the_slowed_path_is_exact_and_runs_one_position_per_decoder_piece(interval, monkeypatch):
    _, model = tiny_model(feedback_interval=interval)
    model.train()
    x = tokens()
    pieces = []
    chunk = RLT._chunk
    monkeypatch.setattr(RLT, "_chunk", lambda self, z, *a: pieces.append(z.shape[1]) or chunk(self, z, *a))

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        loss = model(x[:, :-1], x[:, 1:]).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    chunked, chunked_grads = loss_and_grads()
    assert max(pieces) > 1
    token_by_token(model)
    pieces.clear()
    slow, slow_grads = loss_and_grads()
    assert pieces == [1] * T
    torch.testing.assert_close(slow, chunked, rtol=1e-12, atol=0)
    for a, b in zip(slow_grads, chunked_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--threads", "1", "0"], ["--batch", "3"]])
def test_rlt_speed_bad_argument_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2 and "must be a positive integer" in capsys.readouterr().err
