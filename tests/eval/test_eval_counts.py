"""rgpt-eval's counts from the command line are bounded before anything proportional to them is
allocated: diagnostics --r (one forward keeps r + 1 states; the CKA statistics hold (r + 1)(r + 2) / 2
matrices of d_model^2 doubles). The phi fit's --restarts / --bootstrap: tests/eval/phi/test_runs.py."""
import pytest
import torch

from launcher.eval import main
from rgpt_dist.checkpoints.native import write_native
from rgpt_dist.config import RecurrentGPTConfig
from rgpt_dist.registry import build_model


def test_diagnostics_depth_is_bounded_before_any_batch_is_read(tmp_path, capsys, monkeypatch):
    cfg = RecurrentGPTConfig(n_pre=1, n_rec=1, n_coda=1, n_loops=2, vocab_size=300, block_size=32, d_model=32, n_head=4)
    write_native(build_model(cfg, seed=0).state_dict(), cfg, tmp_path / "exp" / "native", torch.float32,
                 {"step": 1, "data": {"paths": [str(tmp_path / "no-data")], "val_split": "val"}})
    monkeypatch.setattr("launcher.eval.val_batches", lambda *a, **k: pytest.fail("batches read"))
    with pytest.raises(SystemExit) as e:  # beyond any model's bound: refused while parsing
        main(["diagnostics", str(tmp_path / "exp"), "--r", "100000000", "--out", str(tmp_path / "d")])
    assert e.value.code == 2 and "argument --r: '100000000' is out of range: an integer from 1 to 16,384" \
        in capsys.readouterr().err
    # beyond this model's: 16 x R = 32 (the CKA statistics of d_model 32 would allow r = 1022)
    assert main(["diagnostics", str(tmp_path / "exp"), "--r", "33", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "--r 33 is out of range" in err and "at most 32 (16 x the trained depth R = 2 is 32" in err, err
    assert "up to r = 1022" in err and not (tmp_path / "d").exists()
