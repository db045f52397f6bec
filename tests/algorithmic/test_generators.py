"""Every generator's labels recomputed by the independent solvers of tests/algorithmic/solvers.py, the
serialisation and the loss mask checked position by position, and the paper's length ranges."""
from __future__ import annotations

import numpy as np
import pytest

from rgpt_dist.algorithmic import (BOS_ID, EOS_ID, IGNORE_INDEX, TASKS, VOCAB_CAPACITY, get_task,
                                   make_batch)
from tests.algorithmic import solvers


def _strings(task, ids):
    return [task.vocab[i] for i in np.asarray(ids).tolist()]


def _examples(task, n_train=150):
    """Training draws, the first validation examples, and accepted draws of the test stream at the
    shortest and longest test lengths (drawn directly: building a whole 1,024-set costs seconds)."""
    from rgpt_dist.algorithmic.base import Example
    out = [task.example("train", i) for i in range(n_train)]
    out += [task.example("val", i, task.lengths("val")[0]) for i in range(4)]
    for length in {task.lengths("test")[0], task.lengths("test")[-1]}:
        for j in range(4):
            s = task.draw("test", task.seed("test"), j, length)
            out.append(Example(s.tokens, s.targets, s.targets != IGNORE_INDEX, length))
    return out


def test_parity_final_bit():
    task = get_task("parity")
    for e in _examples(task):
        toks = _strings(task, e.tokens)
        assert toks[0] == "<bos>" and len(toks) == e.length + 1
        assert e.mask.tolist() == [False] * e.length + [True]
        assert _strings(task, e.targets[e.mask]) == [solvers.parity(toks[1:])]


@pytest.mark.parametrize("name", ["s5_standard", "s5_swaps"])
def test_s5_running_product_every_position(name):
    task = get_task(name)
    swaps = {"01234"}                               # identity and the ten transpositions, by hand
    for i in range(5):
        for j in range(i + 1, 5):
            p = list("01234")
            p[i], p[j] = p[j], p[i]
            swaps.add("".join(p))
    assert len(swaps) == 11
    for e in _examples(task):
        toks = _strings(task, e.tokens)
        assert toks[0] == "<bos>" and len(toks) == e.length + 1
        assert e.mask.tolist() == [False] + [True] * e.length
        assert _strings(task, e.targets[1:]) == solvers.s5_states(toks[1:])
        if name == "s5_swaps":
            assert set(toks[1:]) <= swaps
    if name == "s5_standard":                        # all 120 permutations occur as inputs
        seen = {t for e in _examples(task, 60) for t in _strings(task, e.tokens[1:])}
        assert len(seen) == 120


@pytest.mark.parametrize("name", ["mod5_flat", "mod5_brackets"])
def test_mod5_value_at_equals(name):
    task = get_task(name)
    for e in _examples(task):
        toks = _strings(task, e.tokens)
        assert toks[0] == "<bos>" and toks[-1] == "=" and len(toks) == e.length + 2
        assert e.mask.tolist() == [False] * (e.length + 1) + [True]
        assert _strings(task, e.targets[e.mask]) == [solvers.mod5_value(toks[1:-1])]
        if name == "mod5_flat":
            assert all(t.isdigit() for t in toks[1:-1:2]) and all(t in "+-*" for t in toks[2:-1:2])
            assert e.length % 2 == 1


def test_mod5_brackets_uses_brackets_and_reaches_512():
    task = get_task("mod5_brackets")
    toks = [t for i in range(100) for t in _strings(task, task.example("train", i).tokens)]
    assert {"(", ")", "+", "-", "*"} <= set(toks)
    e = task.example("train", 0, 40)
    long = task._sample(np.random.default_rng(0), 512)          # the longest length it allows
    assert len(long.tokens) == 514 and e.length == 40
    assert _strings(task, long.targets[-1:]) == [solvers.mod5_value(_strings(task, long.tokens[1:-1]))]


def test_addition_teacher_forced_answer_and_eos():
    task = get_task("addition")
    examples = [task.example("train", i) for i in range(200)]
    examples += [task.example("val", i) for i in range(20)]
    examples += [task.example("test", i, w) for w in (9, 32) for i in range(8)]
    for e in examples:
        seq = _strings(task, np.append(e.tokens, e.targets[-1]))   # tokens + the final target
        assert seq[0] == "<bos>" and seq[-1] == "<eos>"
        text = "".join(seq[1:-1])
        prompt_end = text.index("=") + 1
        assert _strings(task, e.targets[e.mask])[:-1] == list(solvers.addition_answer(text[:prompt_end]))
        assert e.targets[e.mask][-1] == EOS_ID
        # scored exactly from the target after '=' (the space) to EOS; prompt positions never
        assert e.mask.tolist() == [False] * prompt_end + [True] * (len(e.tokens) - prompt_end)
        scored = e.mask[:-1]                                           # teacher forcing: the answer
        assert (e.tokens[1:][scored] == e.targets[:-1][scored]).all()  # is read back one step later
    widths = {e.length for e in examples[:200]}
    assert widths == set(range(1, 9))                                 # mixed 1..8-digit training


def test_addition_test_widths_exact_without_leading_zero():
    task = get_task("addition")
    for w in (9, 16):
        for i in range(16):
            text = "".join(_strings(task, task.example("test", i, w).tokens[1:]))
            a, b = (s.strip("[]") for s in text.split(" =")[0].split(" + "))
            assert len(a) == len(b) == w and a[-1] != "0" and b[-1] != "0"   # reversed: top digit last


def test_training_length_distributions():
    lengths = {name: {TASKS[name].example("train", i).length for i in range(600)}
               for name in ("parity", "mod5_flat", "mod5_brackets", "s5_swaps")}
    assert lengths["parity"] == set(range(3, 41))
    assert lengths["mod5_flat"] == set(range(3, 40, 2))
    assert lengths["mod5_brackets"] == set(range(3, 41))
    assert lengths["s5_swaps"] == {32}


def test_vocabularies_within_capacity_and_batches_padded():
    for task in TASKS.values():
        assert len(task.vocab) <= VOCAB_CAPACITY and len(set(task.vocab)) == len(task.vocab)
        assert task.vocab[BOS_ID] == "<bos>" and task.vocab[EOS_ID] == "<eos>"
        b = make_batch(task, "train", range(5), seq_len=600)
        assert b.tokens.shape == b.targets.shape == b.mask.shape == (5, 600)
        assert ((b.targets != IGNORE_INDEX) == b.mask).all() and b.tokens.max() < len(task.vocab)
        for row, i in zip(range(5), range(5)):
            e = task.example("train", i)
            n = len(e.tokens)
            assert (b.tokens[row, :n] == e.tokens).all() and (b.tokens[row, n:] == 0).all()
            assert not b.mask[row, n:].any() and b.lengths[row] == e.length
