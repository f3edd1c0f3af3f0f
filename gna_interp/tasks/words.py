"""The English word list shipped with gna_interp (``gna_interp/data/words.txt``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

WORDS_FILE = Path(__file__).resolve().parent.parent / "data" / "words.txt"


@lru_cache(maxsize=1)
def word_list() -> tuple[str, ...]:
    """The shipped common English words (lowercase, distinct, in file order)."""
    lines = (line.strip() for line in WORDS_FILE.read_text(encoding="utf-8").splitlines())
    return tuple(dict.fromkeys(w for w in lines if w and not w.startswith("#")))
