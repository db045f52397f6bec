"""Graph reachability with adjacency-masked attention (SPEC section 8; the authors'
graph/graph_experiment.py, read for the definitions, not copied).

An example is a directed graph on n <= max_len nodes and a (source, target) pair; the label says
whether target is reachable from source. One token per node, node i (sorted order) carrying the
node-identity token of the i-th letter (the authors name the n nodes of a graph A, B, ... in order, so
the token of position i is always letter i; vocabulary: padding + the 26 letters A-Z, 27 ids, of which
only the first max_len occur). Attention follows the edges: query v may attend key u iff u -> v is an
edge or u == v (attn_mask[v, u]); readout (source, target), roles 1 at the source and 2 at the target.
No positional encoding (`positions = "none"`): the mask is the only structure.

Positives (label 1) at difficulty h: a path of exactly h hops through h + 1 distinct random nodes, then
U[n // 2, 2n] random ordered distractor pairs (u != v), each added unless it would make the source-target
shortest path shorter than h (an existing edge is a no-op), so the shortest path is exactly h.
Negatives (label 0): U[n // 2, 2n] random distractor pairs on n nodes, then the first pair (s, t) with
t unreachable from s, over the pairs i < j of a random node order; if every such pair is connected, a
graph whose edges stay inside one of two halves of that order, s from the first, t from the second.

Number of nodes n (the authors' laws): the training split draws n ~ U[max(8, h + 2), 16] (h <= 5 gives
their U[8, 16]); validation and test buckets draw n ~ U[lo, hi] with hi = min(max(h + 6, 16), 20),
lo = min(max(h + 2, 10), hi) (h = 12: U[14, 18]); both clipped to max_len, and a difficulty whose
h + 1 path nodes cannot fit is an error. Negatives use the same law as the positives of their difficulty.

A negative's "difficulty" (the authors' generator has none): the difficulty of the bucket it belongs to,
i.e. the h whose node-count law drew its graph. It does not measure how many steps the negative needs;
what a test bucket at h measures is accuracy on h-hop positives against the same-size negatives.
Training range 1-5 hops, generator range 1-12; test buckets 500 examples (the authors').
"""
from __future__ import annotations

from collections import deque
from string import ascii_uppercase

import numpy as np

from .base import ThinkingExample, ThinkingTask, ThinkingTaskError

NODE_LETTERS = tuple(ascii_uppercase)     # the authors' node names; token id of letter i is i + 1
TRAIN_NODES = (8, 16)                     # the authors' training node-count range


def _distances(n: int, edges: set, start: int, reverse: bool = False) -> np.ndarray:
    """BFS hop counts from `start` along the edges (reverse: against them); n + 1 = unreachable."""
    out = np.full(n, n + 1, dtype=np.int64)
    nbrs: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        nbrs[v if reverse else u].append(u if reverse else v)
    out[start] = 0
    queue = deque([start])
    while queue:
        x = queue.popleft()
        for y in nbrs[x]:
            if out[y] > out[x] + 1:
                out[y] = out[x] + 1
                queue.append(y)
    return out


def _pair(rng: np.random.Generator, nodes) -> tuple[int, int]:
    """An ordered pair of distinct nodes, uniform (the authors' random.sample(nodes, 2))."""
    i, j = rng.choice(len(nodes), size=2, replace=False)
    return int(nodes[i]), int(nodes[j])


class GraphReachability(ThinkingTask):
    name = "graph"
    code = 101
    vocab = ("<pad>",) + NODE_LETTERS
    readout_k = 2
    train_range = (1, 5)
    eval_range = (1, 12)
    eval_difficulties = (1, 2, 3, 4, 6, 8, 10, 12)
    eval_steps = (1, 2, 3, 5, 8, 12, 15, 20)
    bucket_size = 500
    positions = "none"

    def __init__(self, max_len: int = 20):
        """max_len: the most nodes a graph may have (the attention mask's size), 2..26 (one letter each)."""
        if isinstance(max_len, bool) or not isinstance(max_len, int) or not 2 <= max_len <= len(NODE_LETTERS):
            raise ThinkingTaskError(f"graph max_len must be an integer in 2..{len(NODE_LETTERS)}, "
                                    f"got {max_len!r}")
        self.max_len = max_len

    def node_range(self, split: str, hops: int) -> tuple[int, int]:
        """The inclusive node-count range of a split at a difficulty (module docstring), within max_len."""
        if split == "train":
            lo, hi = max(TRAIN_NODES[0], hops + 2), TRAIN_NODES[1]
        else:
            hi = min(max(hops + 6, 16), 20)
            lo = min(max(hops + 2, 10), hi)
        hi = min(hi, self.max_len)
        return min(lo, hi), hi

    def check_difficulty(self, difficulty) -> int:
        hops = super().check_difficulty(difficulty)
        if hops + 1 > self.max_len:
            raise ThinkingTaskError(f"task 'graph': difficulty {hops} needs a graph of at least {hops + 1} "
                                    f"nodes, more than max_len {self.max_len} (the attention mask's size)")
        return hops

    def _draw(self, rng: np.random.Generator, split: str, hops: int, label: int):
        lo, hi = self.node_range(split, hops)
        n = int(rng.integers(lo, hi + 1))
        edges, s, t = (self._positive if label else self._negative)(rng, n, hops)
        return self.encode(n, edges, s, t, label, hops)

    @staticmethod
    def _positive(rng: np.random.Generator, n: int, hops: int):
        path = [int(x) for x in rng.permutation(n)[:hops + 1]]
        s, t = path[0], path[-1]
        edges = set(zip(path[:-1], path[1:]))
        from_s, to_t = _distances(n, edges, s), _distances(n, edges, t, reverse=True)
        for _ in range(int(rng.integers(n // 2, 2 * n + 1))):
            u, v = _pair(rng, range(n))
            if (u, v) in edges or from_s[u] + 1 + to_t[v] < hops:    # no-op, or a shortcut
                continue
            edges.add((u, v))
            from_s, to_t = _distances(n, edges, s), _distances(n, edges, t, reverse=True)
        return edges, s, t

    @staticmethod
    def _negative(rng: np.random.Generator, n: int, hops: int):
        n_edges = int(rng.integers(n // 2, 2 * n + 1))
        edges = {_pair(rng, range(n)) for _ in range(n_edges)}
        order = [int(x) for x in rng.permutation(n)]
        reach = [_distances(n, edges, x) <= n for x in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                if not reach[order[i]][order[j]]:
                    return edges, order[i], order[j]
        halves = (order[:n // 2], order[n // 2:])        # fallback: two disconnected halves
        edges = set()
        for _ in range(n_edges):
            half = halves[int(rng.integers(2))]
            if len(half) >= 2:
                edges.add(_pair(rng, half))
        s = halves[0][int(rng.integers(len(halves[0])))]
        return edges, s, halves[1][int(rng.integers(len(halves[1])))]

    @staticmethod
    def encode(n: int, edges, s: int, t: int, label: int, hops: int):
        """The example of a graph and its canonical key (the mask and the readout)."""
        edge_arr = np.array(sorted(edges), dtype=np.int64).reshape(-1, 2)     # [E, 2] (u, v): u -> v
        mask = np.eye(n, dtype=bool)
        mask[edge_arr[:, 1], edge_arr[:, 0]] = True       # node v attends to node u for edge u -> v
        roles = np.zeros(n, dtype=np.int64)
        roles[s], roles[t] = 1, 2
        readout = np.array([s, t], dtype=np.int64)
        example = ThinkingExample(np.arange(1, n + 1, dtype=np.int64), int(label), int(hops), readout,
                                  roles, mask, edge_arr)
        return example, bytes([n]) + np.packbits(mask).tobytes() + readout.tobytes()
