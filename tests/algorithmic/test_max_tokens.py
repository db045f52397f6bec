"""Task.max_tokens / max_tokens_of against the longest example actually generated: what the trainer's
seq_len check and the padding rely on (a bound that is too small would fail a batch mid-run; one that
is too large only wastes positions, so the tests also require it to be reached)."""
from __future__ import annotations

import pytest

from rgpt_dist.algorithmic import TASKS, TaskError, get_task

PER_LENGTH = 8


def _longest(task, split, length, count):
    """The longest of the first `count` draws; held-out lengths read the split's draw stream directly
    (the held-out sets are its first distinct draws; building a whole 1,024-example set is slow)."""
    if split == "train" or length is None:
        return max(len(task.example(split, i, length).tokens) for i in range(count))
    return max(len(task.draw(split, task.seed(split), i, length).tokens) for i in range(count))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_max_tokens_is_the_longest_generated_example_of_each_held_out_length(name):
    task = TASKS[name]
    for split in ("val", "test"):
        longest_of_split = 0
        for length in [n for n in task.lengths(split) if n is not None]:
            longest = _longest(task, split, length, PER_LENGTH)
            longest_of_split = max(longest_of_split, longest)
            assert task.max_tokens(length) == longest, (name, split, length)
        if None not in task.lengths(split):
            assert task.max_tokens_of(split) == longest_of_split, (name, split)


def test_fixed_length_token_counts_are_the_paper_framing():
    """Lengths exclude BOS (and '=' for mod-5, J.6); addition at width w: 2w + 9 prompt tokens, BOS,
    and ' [' + (w + 1 carry digits) + ']' of answer read by the model (EOS is only a target)."""
    assert get_task("parity").max_tokens(256) == 257
    assert get_task("s5_swaps").max_tokens(512) == 513
    assert get_task("mod5_flat").max_tokens(255) == 257
    assert get_task("mod5_brackets").max_tokens(40) == 42
    assert get_task("addition").max_tokens(32) == 1 + (2 * 32 + 9) + 3 + 33


def test_training_mix_bound_is_reached_and_never_exceeded():
    for name, count in (("parity", 400), ("mod5_flat", 400), ("s5_standard", 8), ("addition", 3000)):
        task = TASKS[name]
        assert task.max_tokens() == task.max_tokens_of("train")
        assert _longest(task, "train", None, count) == task.max_tokens(), name
    # addition's validation set pools the training widths: bounded by the same number
    add = get_task("addition")
    assert add.max_tokens_of("val") == add.max_tokens() == 38
    assert _longest(add, "val", None, 256) <= 38


def test_max_tokens_refuses_a_length_the_task_cannot_produce():
    with pytest.raises(TaskError, match="length 34 is outside"):
        get_task("mod5_flat").max_tokens(34)
    with pytest.raises(TaskError, match="unknown split 'dev'"):
        get_task("parity").max_tokens_of("dev")
