"""Zero-shot knowledge: complete a well-known fact, scored over answers of the same kind.

The control that needs no in-context retrieval: no shots, no options listed, nothing in the prompt to
copy. Each sample is one fact of the shipped file ``gna_interp/data/facts.tsv`` (written for this
package: capitals, landmarks, languages, currencies, young animals, animal sounds, colors, opposites,
jobs, places, counts, days, months, planets, people, authors, continents, elements, body parts,
animals)::

    The capital of France is            -> candidates " Paris", " Oslo", " Lima", " Cairo" (gold " Paris")

The wrong candidates are other answers of the same category (capital cities for a capital, colors for
a color), never a word the prompt mentions (``"If today is Monday, tomorrow is"`` is not offered
``" Monday"``). A model that knows the fact solves it from its weights alone, so removing a G&A
circuit should leave the accuracy where it was, while removing a head the whole network leans on
lowers it: the knowledge twin of a retrieval task (the paper's "knowledge benchmarks unchanged").

Spans: no item lines (there is nothing to gather); ``query`` is the fact's subject (``"France"``).
``cue_start`` is 0: the whole prompt is the cue, so a chat template (``with_chat_template``) opens
the reply with it after an empty user turn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from numbers import Integral
from os.path import commonprefix
from pathlib import Path
from typing import Any, Sequence

from gna_interp.errors import InputError
from gna_interp.tasks.base import FORMAT_VERSION, Task
from gna_interp.tasks.sample import Sample
from gna_interp.tasks.seeding import StableRng
from gna_interp.tasks.segments import CharSegments

__all__ = ["FACTS_FILE", "Fact", "Knowledge", "fact_categories", "facts", "mentions"]

FACTS_FILE = Path(__file__).resolve().parent.parent / "data" / "facts.tsv"
COLUMNS = ("category", "subject", "prompt", "answer")
STEM = 4  # two words sharing their first STEM letters count as the same word ("Japan" / "Japanese")


@dataclass(frozen=True)
class Fact:
    """One fact: ``prompt + " " + answer`` is a true sentence; ``subject`` is the part of the prompt
    it is about; the wrong answers come from other facts of the same ``category``."""

    category: str
    subject: str
    prompt: str
    answer: str


def _words(text: str) -> list[str]:
    """Lower-case words of two letters or more (digits and punctuation split words)."""
    return [w for w in re.findall(r"[^\W\d_]+", text.lower()) if len(w) > 1]


def mentions(prompt: str, text: str) -> bool:
    """Whether ``prompt`` already contains a word of ``text`` or a word of the same stem (the first
    4 letters in common, case ignored): such a candidate could be copied from the context."""
    said = _words(prompt)
    return any(w == p or len(commonprefix([w, p])) >= STEM for w in _words(text) for p in said)


def _parse(text: str, where: str) -> tuple[Fact, ...]:
    out: list[Fact] = []
    seen: set[str] = set()
    header = False
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if not header:
            if tuple(c.strip() for c in cells) != COLUMNS:
                raise InputError(f"{where} line {n}: the header must be the tab-separated columns {COLUMNS}, "
                                 f"got {cells!r}")
            header = True
            continue
        if len(cells) != len(COLUMNS):
            raise InputError(f"{where} line {n}: expected {len(COLUMNS)} tab-separated cells {COLUMNS}, "
                             f"got {len(cells)}: {line!r}")
        fact = Fact(*cells)
        if any(c != c.strip() or not c for c in cells):
            raise InputError(f"{where} line {n}: a cell is empty or has surrounding spaces: {line!r}")
        if fact.subject not in fact.prompt:
            raise InputError(f"{where} line {n}: the subject {fact.subject!r} is not in the prompt {fact.prompt!r}")
        if mentions(fact.prompt, fact.answer):
            raise InputError(f"{where} line {n}: the prompt {fact.prompt!r} already says the answer "
                             f"{fact.answer!r} (or a word of its stem); rephrase it")
        if fact.prompt in seen:
            raise InputError(f"{where} line {n}: the prompt {fact.prompt!r} appears twice")
        seen.add(fact.prompt)
        out.append(fact)
    if not out:
        raise InputError(f"{where} holds no facts")
    return tuple(out)


@lru_cache(maxsize=1)
def facts() -> tuple[Fact, ...]:
    """The shipped facts (``gna_interp/data/facts.tsv``), in file order."""
    return _parse(FACTS_FILE.read_text(encoding="utf-8"), repr(FACTS_FILE.name))


def fact_categories() -> dict[str, tuple[str, ...]]:
    """``{category: its distinct answers}`` of the shipped facts, in file order (the candidate pools)."""
    pools: dict[str, dict[str, None]] = {}
    for f in facts():
        pools.setdefault(f.category, {})[f.answer] = None
    return {c: tuple(p) for c, p in pools.items()}


class Knowledge(Task):
    """``n_samples`` distinct facts, each scored over its answer and ``n_choices - 1`` wrong answers.

    Facts are drawn without replacement from the shipped file (only ``categories``, if given), wrong
    answers uniformly from the fact's category minus anything the prompt mentions, the gold position
    uniform. Seeded with :class:`StableRng`: the same arguments give the same samples on every machine,
    and a smaller ``n_samples`` gives the first samples of a larger one.
    """

    def __init__(self, n_samples: int = 64, seed: int = 0, n_choices: int = 4,
                 categories: Sequence[str] | None = None) -> None:
        for name, value, low in (("n_samples", n_samples, 1), ("n_choices", n_choices, 2)):
            if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
                raise InputError(f"{name} must be an integer >= {low}, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, Integral):
            raise InputError(f"seed must be an integer, got {seed!r}")
        pools = fact_categories()
        chosen = self._check_categories(categories, pools)
        usable = [f for f in facts() if f.category in chosen and len(self._wrong(f, pools)) >= n_choices - 1]
        if n_samples > len(usable):
            raise InputError(
                f"n_samples={n_samples} asks for more facts than the {len(usable)} that have {n_choices} "
                f"candidates in the categories {sorted(chosen)}; lower n_samples or n_choices, or allow more "
                f"categories")
        self.seed, self.n_choices = int(seed), int(n_choices)
        self.categories = None if categories is None else tuple(chosen)
        drawn = StableRng("knowledge", self.seed).sample(usable, int(n_samples))
        samples = [self._sample(i, f, pools) for i, f in enumerate(drawn)]
        super().__init__("knowledge", samples)

    @staticmethod
    def _check_categories(categories: Sequence[str] | None, pools: dict[str, tuple[str, ...]]) -> list[str]:
        if categories is None:
            return list(pools)
        if isinstance(categories, (str, bytes)):
            raise InputError(f"categories={categories!r} is a single string; pass a list, e.g. [{categories!r}]")
        items = list(categories)
        if not all(isinstance(c, str) for c in items):
            raise InputError(f"categories must be category names (strings), got {items!r}; "
                             f"choose among {sorted(pools)}")
        chosen = list(dict.fromkeys(items))
        unknown = [c for c in chosen if c not in pools]
        if unknown or not chosen:
            raise InputError(f"unknown fact categories {unknown!r}; choose among {sorted(pools)}" if unknown else
                             f"categories is empty; pass None for all, or some of {sorted(pools)}")
        return chosen

    @staticmethod
    def _wrong(fact: Fact, pools: dict[str, tuple[str, ...]]) -> list[str]:
        """The answers of ``fact``'s category that may be offered as wrong candidates."""
        return [a for a in pools[fact.category] if a != fact.answer and not mentions(fact.prompt, a)]

    def _sample(self, i: int, fact: Fact, pools: dict[str, tuple[str, ...]]) -> Sample:
        rng = StableRng("knowledge", self.seed, i)
        wrong = rng.sample(self._wrong(fact, pools), self.n_choices - 1)
        gold = rng.below(self.n_choices)
        answers = wrong[:gold] + [fact.answer] + wrong[gold:]
        at = fact.prompt.index(fact.subject)
        return Sample(fact.prompt, tuple(f" {a}" for a in answers), gold,
                      CharSegments((), (at, at + len(fact.subject))), 0,
                      {"category": fact.category, "subject": fact.subject, "fact": facts().index(fact)})

    def to_dict(self) -> dict[str, Any]:
        """The constructor's arguments (``kind: "knowledge"``); the seeded rebuild gives identical samples."""
        args = {"n_samples": len(self), "seed": self.seed, "n_choices": self.n_choices,
                "categories": None if self.categories is None else list(self.categories)}
        return {"format_version": FORMAT_VERSION, "kind": "knowledge", "name": self.name, "n_samples": len(self),
                "args": args}
