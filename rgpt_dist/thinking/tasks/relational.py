"""Relational text over shuffled facts (SPEC section 8; the authors' family-reason/family_experiment.py,
read for the definitions, not copied).

Vocabulary (word level, the authors' 54 words): [PAD] 0, [CLS] 1, [SEP] 2, twenty names, the 25 relation
words (for k = 1..12 the offset +k then -k: parent / child, grandparent / grandchild, then
"great-" * (k - 2) + grandparent / grandchild; then sibling for offset 0), and is, the, of, query, :, .

An example at chain length K: K + 1 distinct names e_0..e_K and u ~ U[0, K] "up" hops: the facts
"e_i is the parent of e_{i+1} ." for i < u and "e_i is the child of e_{i+1} ." for i >= u, so e_0 is
u - (K - u) = 2u - K generations above e_K. Distractors: U[2, 4] attempts to draw an unordered pair of
names outside the chain (a repeated pair is skipped, so there may be fewer), each "a is the R of b ."
with R uniform over parent, child, sibling. Facts and distractors are shuffled together, then the
query "query : e_0 is the R of e_K [SEP]" follows, all after [CLS]. A positive asks the true offset
2u - K; a negative the true offset plus a delta uniform over {+2, -2, +4, -4} kept inside -12..12 (an
even delta keeps the parity of K, so parity is no shortcut). Readout: the CLS position.

Positions: the authors' model uses rotary positions here as on the logic task (their README and code:
"full attention + RoPE, facts shuffled"), so `positions = "rope"`, as SPEC section 8 says. The
abstract's "no positional cue" describes the input, not the encoding: the facts are shuffled, so a
fact's position says nothing about its place in the chain (unlike the graph's mask or the logic
task's nesting), and the model must route through the names.

Label balance: the index's label (base.py), as the authors alternate positives and negatives within a
chain length. Training chains 2-5, generator range 2-9 (all the authors evaluate); max_len 128 (every
example fits: 7 (K + 4) + 10 <= 101 tokens at K = 9). Test buckets: the authors use 2000 per chain length
on this task (`bucket_size`), 500 on the other two.
"""
from __future__ import annotations

import numpy as np

from .base import ThinkingTask, sequence_example

NAMES = ("Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Henry", "Irene", "Jack", "Karen",
         "Leo", "Mia", "Nick", "Olivia", "Paul", "Quinn", "Rose", "Sam", "Tina")
MAX_OFFSET = 12


def relation_word(offset: int) -> str:
    """The relation of a signed generation offset: +1 parent, -1 child, 0 sibling, +-2 grand-, ..."""
    if offset == 0:
        return "sibling"
    base = "parent" if offset > 0 else "child"
    if abs(offset) >= 2:
        base = "great-" * (abs(offset) - 2) + ("grandparent" if offset > 0 else "grandchild")
    return base


RELATIONS = tuple(relation_word(s * k) for k in range(1, MAX_OFFSET + 1) for s in (1, -1)) + ("sibling",)
VOCAB = ("[PAD]", "[CLS]", "[SEP]") + NAMES + RELATIONS + ("is", "the", "of", "query", ":", ".")
_ID = {w: i for i, w in enumerate(VOCAB)}


def sentence(a: str, relation: str, b: str) -> list[str]:
    return [a, "is", "the", relation, "of", b, "."]


class RelationalText(ThinkingTask):
    name = "relational"
    code = 103
    vocab = VOCAB
    readout_k = 1
    train_range = (2, 5)
    eval_range = (2, 9)
    eval_difficulties = (2, 3, 4, 5, 6, 7, 8, 9)
    eval_steps = (1, 2, 4, 6, 8, 10, 12, 16, 20)
    bucket_size = 2000
    max_len = 128
    positions = "rope"

    def _draw(self, rng: np.random.Generator, split: str, chain: int, label: int):
        names = [NAMES[int(i)] for i in rng.permutation(len(NAMES))]
        entities, rest = names[:chain + 1], names[chain + 1:]
        up = int(rng.integers(0, chain + 1))
        facts = [sentence(entities[i], "parent" if i < up else "child", entities[i + 1])
                 for i in range(chain)]
        offset = 2 * up - chain
        if not label:
            deltas = [d for d in (2, -2, 4, -4) if abs(offset + d) <= MAX_OFFSET]
            offset += deltas[int(rng.integers(len(deltas)))]
        used = set()
        for _ in range(int(rng.integers(2, 5))):
            if len(rest) < 2:
                break
            i, j = rng.choice(len(rest), size=2, replace=False)
            if frozenset((i, j)) in used:
                continue
            used.add(frozenset((i, j)))
            facts.append(sentence(rest[i], ("parent", "child", "sibling")[int(rng.integers(3))], rest[j]))
        words = ["[CLS]"]
        for k in rng.permutation(len(facts)):
            words += facts[int(k)]
        words += ["query", ":"] + sentence(entities[0], relation_word(offset), entities[-1])[:-1] + ["[SEP]"]
        if len(words) > self.max_len:
            return None, b""
        return sequence_example([_ID[w] for w in words], label, chain)
