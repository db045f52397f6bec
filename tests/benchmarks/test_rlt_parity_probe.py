"""benchmarks/rlt_parity_probe.py: its swaps-S5 batches (words of lo..hi swaps, padded) carry the running
product at every operation as the independent solver composes it, and nothing on BOS or padding; the
probe's loop runs a few steps on S5 with a growing length and reports accuracy at each --eval length."""
import numpy as np
import torch

from benchmarks.rlt_parity_probe import main, s5_batch
from rgpt_dist.algorithmic import get_task
from tests.algorithmic import solvers


def test_s5_batches_score_every_operation_with_the_solvers_running_product():
    vocab = get_task("s5_swaps").vocab
    x, y = s5_batch(64, 1, 8, np.random.default_rng(0))
    assert x.shape == y.shape == (64, 9) and (x[:, 0] == 1).all() and (y[:, 0] == -100).all()
    lengths = set()
    for tokens, targets in zip(x.tolist(), y.tolist()):
        n = sum(t != 0 for t in tokens) - 1
        lengths.add(n)
        words = [vocab[t] for t in tokens[1:n + 1]]
        assert all(w.count(str(k)) == 1 for w in words for k in range(5))
        assert sum(a != b for a, b in zip(words[0], "01234")) in (0, 2)   # identity or one transposition
        assert [vocab[t] for t in targets[1:n + 1]] == solvers.s5_states(words)
        assert targets[n + 1:] == [-100] * (8 - n) and tokens[n + 1:] == [0] * (8 - n)
    assert lengths == set(range(1, 9))


def test_the_probe_trains_s5_with_a_growing_length_and_reports_each_length(capsys):
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    try:  # the probe sets the process's threads and seed: give them back to the other tests
        _probe_s5()
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)
    out = capsys.readouterr().out
    assert "max 2" in out and "accuracy {4: " in out and ", 6: " in out


def _probe_s5():
    main(["--task", "s5_swaps", "--minlen", "1", "--maxlen", "6", "--grow", "0:2:2", "--batch", "4",
          "--steps", "3", "--eval", "4,6", "--set", "mup_base_width=128"])
