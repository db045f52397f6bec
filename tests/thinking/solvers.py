"""Independent solvers for the thinking tasks, written from the task definitions (SPEC section 8, the
authors' code) without the package's helpers: they read an example's tokens / edges / mask and
recompute its label and difficulty."""
from __future__ import annotations

import hashlib


def shortest_hops(n: int, edges, source: int, target: int) -> int | None:
    """Hop count of the shortest directed path source -> target over (u, v) edges; None if none."""
    frontier, seen, hops = {source}, {source}, 0
    while frontier:
        if target in frontier:
            return hops
        frontier = {v for (u, v) in edges if u in frontier and v not in seen}
        seen |= frontier
        hops += 1
    return None


def reachable_through_mask(mask, source: int, target: int) -> bool:
    """Whether information written at `source` can reach `target` by repeated masked attention:
    query i reads key j where mask[i][j], so it flows j -> i."""
    n = len(mask)
    known = {source}
    for _ in range(n):
        known |= {i for i in range(n) for j in known if mask[i][j]}
    return target in known


def expected_mask(n: int, width: int, edges) -> list[list[bool]]:
    """The graph mask written out by hand: query v attends key u for each edge u -> v, and every
    position (padding included) attends itself."""
    m = [[i == j for j in range(width)] for i in range(width)]
    for u, v in edges:
        m[v][u] = True
    return m


def boolean_value(chars: list[str]) -> bool:
    """The expression's value, by rewriting it as Python (not > and > or: the same precedence)."""
    words = {"T": " True ", "F": " False ", "&": " and ", "|": " or ", "!": " not ", "(": " ( ", ")": " ) "}
    return bool(eval("".join(words[c] for c in chars), {"__builtins__": {}}, {}))


def nesting_depth(chars: list[str]) -> int:
    depth = best = 0
    for c in chars:
        depth += (c == "(") - (c == ")")
        best = max(best, depth)
    assert depth == 0
    return best


def relation_offset(word: str) -> int:
    """Generations the subject lies above the object: parent +1, child -1, sibling 0, grand* +-2,
    each 'great-' one more."""
    if word == "sibling":
        return 0
    greats = word.count("great-")
    core = word.replace("great-", "")
    magnitude = {"parent": 1, "child": 1, "grandparent": 2 + greats, "grandchild": 2 + greats}[core]
    assert greats == 0 or core.startswith("grand")
    return magnitude if core.endswith("parent") else -magnitude


def resolve_relation(words: list[str]) -> tuple[bool, int]:
    """(whether the query holds, the number of facts on the chain from its subject to its object)
    for "[CLS] <facts: 'a is the R of b .'> query : a is the R of b [SEP]"."""
    assert words[0] == "[CLS]" and words[-1] == "[SEP]"
    q = words.index("query")
    body, query = words[1:q], words[q + 2:-1]
    assert len(body) % 7 == 0 and words[q + 1] == ":"
    links: dict[str, list[tuple[str, int]]] = {}
    for k in range(0, len(body), 7):
        a, is_, the, rel, of, b, dot = body[k:k + 7]
        assert (is_, the, of, dot) == ("is", "the", "of", ".")
        links.setdefault(a, []).append((b, relation_offset(rel)))    # gen(a) - gen(b) = offset
        links.setdefault(b, []).append((a, -relation_offset(rel)))
    subject, _, _, rel, _, obj = query
    above = {subject: (0, 0)}               # name -> (gen(subject) - gen(name), facts used)
    frontier = [subject]
    while frontier:
        nxt = []
        for x in frontier:
            for y, off in links.get(x, []):
                if y not in above:
                    above[y] = (above[x][0] + off, above[x][1] + 1)
                    nxt.append(y)
        frontier = nxt
    offset, length = above[obj]
    return offset == relation_offset(rel), length


def partition_bucket(task_name: str, key: bytes) -> int:
    """The suite's split bucket of a key, written out: blake2b-64 keyed by the task name, mod 16."""
    digest = hashlib.blake2b(key, digest_size=8, person=task_name.encode()[:16]).digest()
    return int.from_bytes(digest, "little") % 16
