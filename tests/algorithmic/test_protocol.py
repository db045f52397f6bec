"""The paper's protocol numbers (RLT J.1.1, J.5, J.6) and hand-worked examples of each serialisation.

The paper prints no serialised example: its Tables 2 and 6 are results (validation accuracies and
selected checkpoint steps), which the generators cannot reproduce; what the text fixes is checked here."""
from __future__ import annotations

import numpy as np

from rgpt_dist.algorithmic import (MODEL_SEEDS, TASKS, TEST_SEED, TRAIN_SEED, VAL_SEED,
                                   VOCAB_CAPACITY, get_task, heldout_batches)
from rgpt_dist.algorithmic.state_tasks import PERM_INDEX


def _render(task, sample):
    return " ".join(task.vocab[t] for t in sample.tokens.tolist())


def test_seeds_grids_and_set_sizes():
    assert (TRAIN_SEED, VAL_SEED, TEST_SEED) == (20260914, 20260915, 20260916)
    assert MODEL_SEEDS == (42, 43, 44) and VOCAB_CAPACITY == 277
    assert get_task("addition").seed("train") == 42 and get_task("addition").seed("test") == TEST_SEED
    grid8 = (32, 40, 48, 64, 96, 128, 192, 256)
    expected = {
        "parity": ((32, 36, 40), grid8), "mod5_brackets": ((32, 36, 40), grid8),
        "mod5_flat": ((33, 35, 39), tuple(n - 1 for n in grid8)),
        "s5_standard": ((32,), (32, 48, 64, 96, 128, 192, 256, 512)),
        "s5_swaps": ((32,), (32, 48, 64, 96, 128, 192, 256, 512)),
        "addition": ((None,), (9, 10, 11, 12, 14, 16, 32)),
    }
    for name, (val, test) in expected.items():
        task = TASKS[name]
        assert (task.lengths("val"), task.lengths("test")) == (val, test)
        assert task.set_size("val") == 256
        assert task.set_size("test") == (256 if name == "addition" else 1024)


def test_flat_mod5_has_L_plus_1_input_tokens():
    """J.6: requested even length L -> expression length L - 1 -> L + 1 tokens with BOS and '='."""
    task = get_task("mod5_flat")
    for even in (32, 64):
        s = task.draw("test", task.seed("test"), 0, even - 1)
        assert len(s.tokens) == even + 1


def test_worked_examples():
    parity = get_task("parity")
    s = parity.encode(np.array([1, 0, 1, 1]))
    assert _render(parity, s) == "<bos> 1 0 1 1" and parity.vocab[s.targets[-1]] == "1"

    s5 = get_task("s5_swaps")       # (0 1), then (1 2): 0->1->2, 1->0->0, 2->2->1
    s = s5.encode(np.array([PERM_INDEX[(1, 0, 2, 3, 4)], PERM_INDEX[(0, 2, 1, 3, 4)]]))
    assert [s5.vocab[t] for t in s.targets[1:]] == ["10234", "20134"]

    add = get_task("addition")      # 123 + 989 = 1112, digits reversed: [321] + [989] = [2111]
    s = add.encode([3, 2, 1], [9, 8, 9])
    text = "".join(add.vocab[t] for t in s.tokens[1:].tolist())
    assert text == "[321] + [989] = [2111]"
    scored = [add.vocab[t] for t in s.targets[s.targets >= 0].tolist()]
    assert scored == [" ", "[", "2", "1", "1", "1", "]", "<eos>"]


def test_heldout_batches_cover_the_set_once():
    task = get_task("parity")
    rows = [r.tobytes() for b in heldout_batches(task, "val", 36, 100) for r in b.tokens]
    assert len(rows) == 256 == len(set(rows))
    batches = list(heldout_batches(get_task("addition"), "val", None, 128))   # the pooled 1-8 set
    assert [len(b.tokens) for b in batches] == [128, 128]
    assert set(np.concatenate([b.lengths for b in batches]).tolist()) == set(range(1, 9))
