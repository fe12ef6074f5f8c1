"""Seeds: every random choice in cadence derives from the run's seed and a path of names.

``derive_seed(seed, "batch", epoch, index)`` gives the same 63-bit seed on every thread, process and
machine, so a batch, a table's initial rows or a split are identical whoever computes them, in
whatever order, and after a resume.
"""

from __future__ import annotations

import hashlib


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed from a root seed and a path of names and numbers (stable across runs)."""
    text = ":".join(str(p) for p in (seed, *parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & ((1 << 63) - 1)
