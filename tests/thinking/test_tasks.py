"""The three thinking tasks' generators (rgpt_dist/thinking/tasks): every label recomputed by an
independent solver (tests/thinking/solvers.py), the graph mask checked edge by edge, per-bucket label
balance, determinism across processes, split disjointness, the batch layout and every error path."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from rgpt_dist.thinking.inputs import make_batch
from rgpt_dist.thinking.tasks import TASKS, GraphReachability, ThinkingTaskError, bucket, get_task
from tests.thinking import solvers

GRAPH, LOGIC, REL = TASKS["graph"], TASKS["logic"], TASKS["relational"]


def _words(task, example) -> list[str]:
    return [task.vocab[i] for i in example.tokens]


def _check_graph(e, split):
    n = len(e.tokens)
    edges = [tuple(int(x) for x in row) for row in e.edges]
    s, t = (int(x) for x in e.readout)
    assert list(e.tokens) == list(range(1, n + 1)) and n <= GRAPH.max_len
    assert all(u != v and 0 <= u < n and 0 <= v < n for u, v in edges) and s != t
    assert e.attn_mask.tolist() == solvers.expected_mask(n, n, edges)     # in-neighbours and self only
    assert [int(r) for r in e.roles] == [1 if i == s else 2 if i == t else 0 for i in range(n)]
    hops = solvers.shortest_hops(n, edges, s, t)
    assert e.label == (hops is not None) == solvers.reachable_through_mask(e.attn_mask.tolist(), s, t)
    if e.label:
        assert hops == e.difficulty                  # the shortest path is exactly the difficulty
    h = e.difficulty
    lo, hi = (max(8, h + 2), 16) if split == "train" else (min(max(h + 2, 10), min(max(h + 6, 16), 20)),
                                                           min(max(h + 6, 16), 20))
    assert lo <= n <= hi                             # the authors' node-count laws


def test_graph_labels_masks_and_paths():
    for split in ("train", "test"):
        for h in (1, 3, 5, 8, 12):
            for i in range(12):
                e = GRAPH.example(split, i, h)
                assert e.difficulty == h and e.label == 1 - i % 2
                _check_graph(e, split)
    for i in range(60):                              # the training mix
        _check_graph(GRAPH.example("train", i), "train")


def test_logic_labels_and_depths():
    for d in range(1, 15):
        for i in range(4 if d > 10 else 10):
            e = LOGIC.example("test" if i % 3 else "train", i, d)
            chars = _words(LOGIC, e)
            assert chars[0] == "[CLS]" and len(chars) <= 128 and list(e.readout) == [0]
            assert solvers.nesting_depth(chars[1:]) == d == e.difficulty
            assert e.label == int(solvers.boolean_value(chars[1:])) == 1 - i % 2
            assert e.roles is None and e.attn_mask is None


def test_relational_labels_and_chains():
    for k in range(2, 10):
        for i in range(16):
            e = REL.example("val" if i % 4 == 0 else "test", i, k)
            holds, chain = solvers.resolve_relation(_words(REL, e))
            assert e.label == int(holds) == 1 - i % 2 and chain == k == e.difficulty
            assert list(e.readout) == [0] and len(e.tokens) <= REL.max_len and e.roles is None


def test_authors_vocabularies_and_attributes():
    assert (GRAPH.vocab_size, LOGIC.vocab_size, REL.vocab_size) == (27, 9, 54)
    assert (GRAPH.readout_k, LOGIC.readout_k, REL.readout_k) == (2, 1, 1)
    assert (GRAPH.positions, LOGIC.positions, REL.positions) == ("none", "rope", "rope")
    assert (GRAPH.train_range, GRAPH.eval_range, GRAPH.max_len) == ((1, 5), (1, 12), 20)
    assert (LOGIC.train_range, LOGIC.eval_range, REL.train_range, REL.eval_range) == ((1, 8), (1, 14),
                                                                                      (2, 5), (2, 9))
    assert LOGIC.vocab[:2] == ("<pad>", "[CLS]") and REL.vocab[0] == "[PAD]" and GRAPH.vocab[0] == "<pad>"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_buckets_are_label_balanced(name):
    """At every evaluation difficulty a constant predictor scores exactly 0.5 on a test bucket, the
    labels being recomputed by the solvers, not read from the generator."""
    task = TASKS[name]
    for d in task.eval_difficulties:
        examples = bucket(task, "test", d, 8 if d > 10 else 16)
        if name == "graph":
            truth = [solvers.shortest_hops(len(e.tokens), e.edges.tolist(), *e.readout.tolist()) is not None
                     for e in examples]
        elif name == "logic":
            truth = [solvers.boolean_value(_words(task, e)[1:]) for e in examples]
        else:
            truth = [solvers.resolve_relation(_words(task, e))[0] for e in examples]
        assert [e.label for e in examples] == [int(x) for x in truth]
        assert {e.difficulty for e in examples} == {d}
        for constant in (0, 1):
            assert np.mean([constant == x for x in truth]) == 0.5
    assert task.bucket_size == (2000 if name == "relational" else 500)


def test_training_mix_draws_every_training_difficulty():
    for task in TASKS.values():
        lo, hi = task.train_range
        seen = [task.example("train", i).difficulty for i in range(60)]
        assert set(seen) == set(range(lo, hi + 1))
        assert [task.example("train", i).difficulty for i in range(10)] == seen[:10]


_SCRIPT = """
import sys
from rgpt_dist.thinking.tasks import get_task
for name, split, index, d in {items!r}:
    e = get_task(name).example(split, index, d)
    sys.stdout.buffer.write(e.tokens.tobytes() + e.readout.tobytes() + bytes([e.label, e.difficulty])
                            + (b"" if e.attn_mask is None else e.attn_mask.tobytes()))
"""
ITEMS = [(name, split, i, d) for name in sorted(TASKS) for split in ("train", "test")
         for i, d in ((0, None), (7, 3), (123456789, None))]


def _bytes(items) -> bytes:
    out = b""
    for name, split, index, d in items:
        e = get_task(name).example(split, index, d)
        out += e.tokens.tobytes() + e.readout.tobytes() + bytes([e.label, e.difficulty])
        out += b"" if e.attn_mask is None else e.attn_mask.tobytes()
    return out


def test_identical_in_another_process_and_order_free():
    env = dict(os.environ, PYTHONHASHSEED="12345", OMP_NUM_THREADS="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.run([sys.executable, "-c", _SCRIPT.format(items=ITEMS) +
                            "assert 'torch' not in sys.modules"],
                           cwd=root, env=env, capture_output=True, check=True, timeout=120).stdout
    assert child == _bytes(ITEMS) and len(child) > 1000
    assert {x: _bytes([x]) for x in reversed(ITEMS)} == {x: _bytes([x]) for x in ITEMS}


def _content(e) -> bytes:
    return e.tokens.tobytes() + e.readout.tobytes() + (b"" if e.attn_mask is None else e.attn_mask.tobytes())


def test_splits_and_indices_draw_different_examples():
    for task in TASKS.values():
        d = task.train_range[1]
        for i in range(4):
            assert len({_content(task.example(s, i, d)) for s in ("train", "val", "test")}) == 3
        assert len({_content(task.example("train", i, d)) for i in range(30)}) == 30


def test_splits_are_disjoint():
    """Logic depth 2 is small enough that 400 unpartitioned draws of two streams share ~11
    expressions (measured); the partition makes that 0. Depth 1 (576 expressions) is exempt."""
    train = {LOGIC.example("train", i, 2).tokens.tobytes() for i in range(400)}
    test = {LOGIC.example("test", i, 2).tokens.tobytes() for i in range(400)}
    assert len(test) > 300 and not train & test
    small = [{LOGIC.example(s, i, 1).tokens.tobytes() for i in range(100)} for s in ("train", "test")]
    assert small[0] & small[1]
    for task, d, split, want in ((LOGIC, 5, "test", {1}), (REL, 3, "val", {0}),
                                 (REL, 6, "train", set(range(2, 16)))):
        got = {solvers.partition_bucket(task.name, task.example(split, i, d).tokens.tobytes())
               for i in range(30)}
        assert got <= want
    g_train = {_content(GRAPH.example("train", i, 1)) for i in range(100)}
    g_test = {_content(GRAPH.example("test", i, 1)) for i in range(100)}
    assert not g_train & g_test


def test_make_batch_graph_layout():
    torch = pytest.importorskip("torch")
    indices = [3, 0, 8, 5]
    batch = make_batch(GRAPH, "test", indices, 6, pad_to=20)
    examples = [GRAPH.example("test", i, 6) for i in indices]
    assert batch.tokens.shape == (4, 20) and batch.attn_mask.shape == (4, 20, 20)
    assert batch.tokens.dtype == batch.labels.dtype == batch.readout.dtype == batch.roles.dtype == torch.int64
    assert batch.attn_mask.dtype == torch.bool and len(batch) == 4
    for b, e in enumerate(examples):
        n = len(e.tokens)
        assert batch.tokens[b].tolist() == e.tokens.tolist() + [0] * (20 - n)
        assert batch.roles[b].tolist() == e.roles.tolist() + [0] * (20 - n)
        assert batch.attn_mask[b].tolist() == solvers.expected_mask(n, 20, e.edges.tolist())
        assert batch.readout[b].tolist() == e.readout.tolist()
    assert batch.labels.tolist() == [0, 1, 1, 0] and batch.difficulty.tolist() == [6] * 4
    tight = make_batch(GRAPH, "test", indices, 6)
    assert tight.tokens.shape[1] == max(len(e.tokens) for e in examples)


def test_make_batch_sequence_layout():
    pytest.importorskip("torch")
    batch = make_batch(REL, "train", range(5))
    examples = [REL.example("train", i) for i in range(5)]
    width = max(len(e.tokens) for e in examples)
    assert batch.roles is None and batch.attn_mask is None and batch.readout.tolist() == [[0]] * 5
    for b, e in enumerate(examples):
        assert batch.tokens[b].tolist() == e.tokens.tolist() + [0] * (width - len(e.tokens))
        assert 0 not in e.tokens.tolist()
    assert batch.difficulty.tolist() == [e.difficulty for e in examples]


def test_errors_name_the_value_before_any_work(monkeypatch):
    with pytest.raises(ThinkingTaskError, match="'maze'.*graph, logic, relational"):
        get_task("maze")
    cases = [
        (lambda: GRAPH.example("train", 0, 13), r"difficulty 13 .*1\.\.12"),
        (lambda: GRAPH.example("train", 0, 0), r"difficulty 0 .*1\.\.12"),
        (lambda: LOGIC.example("test", 0, 15), r"difficulty 15 .*1\.\.14"),
        (lambda: REL.example("test", 0, 1), r"difficulty 1 .*2\.\.9"),
        (lambda: REL.example("test", 0, 2.0), r"difficulty must be an integer, got 2\.0"),
        (lambda: GRAPH.example("dev", 0, 3), "unknown split 'dev'"),
        (lambda: GRAPH.example("train", -1, 3), "index must be .*got -1"),
        (lambda: GRAPH.example("train", True, 3), "index must be an integer, got True"),
        (lambda: GraphReachability(max_len=10).example("test", 0, 12), "12 needs .* 13 nodes.*max_len 10"),
        (lambda: GraphReachability(max_len=27), "max_len must be .*2..26, got 27"),
        (lambda: bucket(LOGIC, "test", 4, 7), "even number.*got 7"),
        (lambda: bucket(LOGIC, "test", 4, 0), "got 0"),
        (lambda: bucket(LOGIC, "test", 99, 2), "difficulty 99"),
        (lambda: make_batch(GRAPH, "test", [0, 1], 3, pad_to=21), "pad_to 21 .*1..20"),
        (lambda: make_batch(GRAPH, "test", [0, -2], 3), "got -2"),
        (lambda: make_batch(GRAPH, "test", [], 3), "at least one index"),
        (lambda: make_batch(GRAPH, "val", [0], 13), "difficulty 13"),
    ]
    for task in TASKS.values():                # nothing may be drawn before the check fails
        monkeypatch.setattr(task, "_draw", lambda *a: pytest.fail("drew before checking"))
    for call, message in cases:
        with pytest.raises(ThinkingTaskError, match=message):
            call()
    monkeypatch.undo()
    with pytest.raises(ThinkingTaskError, match="pad_to 3 must lie in 1[0-9]..20"):
        make_batch(GRAPH, "test", [0], 8, pad_to=3)     # shorter than the graph: found after drawing
