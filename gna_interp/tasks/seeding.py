"""`StableRng`: seeded choices that give the same result on every machine and Python version.

Python only guarantees that ``random.Random(int).random()`` is stable across versions; methods such
as ``sample``/``shuffle``/``randrange`` have changed between releases. Every draw here goes through
``random()`` alone, and each stream is seeded from a SHA-256 of its labels, so a task's samples
depend on nothing but ``(seed, labels)``.
"""

from __future__ import annotations

import hashlib
import random
from typing import Sequence, TypeVar

T = TypeVar("T")


class StableRng:
    """A reproducible random stream named by ``labels`` (e.g. ``StableRng(seed, "kv", i)``)."""

    def __init__(self, *labels: object) -> None:
        digest = hashlib.sha256("\x1f".join(map(repr, labels)).encode()).digest()
        self._r = random.Random(int.from_bytes(digest[:8], "big"))

    def below(self, n: int) -> int:
        """A uniform integer in ``[0, n)``."""
        if n < 1:
            raise ValueError(f"below(n) needs n >= 1, got {n}")
        return min(int(self._r.random() * n), n - 1)

    def sample(self, items: Sequence[T], k: int) -> list[T]:
        """``k`` distinct items in random order (partial Fisher-Yates, its swaps kept in a dict: ``items`` is indexed,
        never copied, so drawing from ``range(10**9)`` costs ``k`` steps, not a billion-item list)."""
        n = len(items)
        if not 0 <= k <= n:
            raise ValueError(f"cannot draw {k} distinct items from {n}")
        moved: dict[int, int] = {}  # position -> index of the item now there (absent: its own)
        out = []
        for i in range(k):
            j = i + self.below(n - i)
            at_i, at_j = moved.get(i, i), moved.get(j, j)
            moved[i], moved[j] = at_j, at_i
            out.append(items[at_j])
        return out

    def shuffled(self, items: Sequence[T]) -> list[T]:
        """A random permutation of ``items``."""
        return self.sample(items, len(items))
