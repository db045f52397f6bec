"""Deterministic seeds derived from integer keys: the same key gives the same seed on every rank,
process and machine (no communication, no dependence on Python's randomised `hash`)."""
from __future__ import annotations

import hashlib
import struct


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from a tuple of ints/strings, e.g. derive_seed(seed, step, "depth")."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        if isinstance(p, str):
            h.update(b"s" + p.encode() + b"\0")
        else:
            h.update(b"i" + struct.pack("<q", int(p)))
    return int.from_bytes(h.digest(), "little") >> 1
