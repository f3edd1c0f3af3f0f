"""KV-retrieval (Bick, Xing & Gu 2025): find the value of one key in an in-context dictionary.

Official template::

    Memorize the following dictionary:
    apple:42
    river:7
    ...
    The value of the key 'river' is            -> candidates " 42", " 7", ... (gold " 7")

Completion template: the same dictionary, then ``river:`` -> candidates ``"42\\n"``, ``"7\\n"``, ...
Candidates are the dictionary's values in line order, so ``candidates[i]`` belongs to line ``i``.
"""

from __future__ import annotations

import copy
from numbers import Integral

from typing import Any, Literal, Sequence

from gna_interp.constants import MAX_LINES, MAX_PAIRS, MAX_SAMPLES, MAX_VALUE
from gna_interp.errors import InputError
from gna_interp.tasks.base import FORMAT_VERSION, Task
from gna_interp.tasks.sample import Sample
from gna_interp.tasks.seeding import StableRng
from gna_interp.tasks.segments import CharSegments, TextBuilder
from gna_interp.tasks.words import word_list

Template = Literal["official", "completion"]
TEMPLATES: tuple[str, ...] = ("official", "completion")
HEADER = "Memorize the following dictionary:\n"
PAPER_SIZES: tuple[int, ...] = (10, 15, 20, 25, 30, 35, 40, 45, 50)
# What follows a value in each template's candidates. The official scorer sums the log-probs of
# " 42": when digits are split into tokens, " 4" is then a prefix of " 42" and always scores at least
# as high, a bias of the official protocol that we keep for fidelity. The completion template ends
# each candidate with the line's newline, so no candidate is a prefix of another.
DEFAULT_VALUE_SUFFIX = {"official": "", "completion": "\n"}




class KVRetrieval(Task):
    """``n_samples`` dictionaries of ``n_pairs`` ``key:value`` lines with one key queried.

    Keys are distinct words from the shipped list (or ``words``), values distinct integers
    ``0..max_value``, the queried line uniform over positions. Seeded with :class:`StableRng`: the same
    arguments give the same prompts on every machine. What follows each value in the candidates is ``""`` for
    ``official`` and ``"\\n"`` for ``completion``; :meth:`with_value_suffix` gives the same task with another.
    """

    def __init__(self, n_pairs: int = 10, n_samples: int = 64, seed: int = 0, template: Template = "official",
                 max_value: int = 99, words: Sequence[str] | None = None) -> None:
        if not isinstance(template, str) or template not in TEMPLATES:
            raise InputError(f"unknown KV template {template!r}; choose one of {TEMPLATES}")
        if isinstance(seed, bool) or not isinstance(seed, Integral):
            raise InputError(f"seed must be an integer (the same seed gives the same prompts), got {seed!r:.60}")
        keys = _check_words(words) if words is not None else word_list()
        if (any(isinstance(v, bool) or not isinstance(v, Integral) for v in (n_pairs, n_samples)) or n_pairs < 2
                or n_samples < 1):
            raise InputError(f"n_pairs must be an integer >= 2 (a dictionary needs two lines to choose between) and "
                             f"n_samples >= 1, got n_pairs={n_pairs!r:.40}, n_samples={n_samples!r:.40}")
        if n_samples > MAX_SAMPLES or n_pairs > MAX_PAIRS:
            raise InputError(f"KVRetrieval({n_pairs}, {n_samples}) is too large: at most {MAX_SAMPLES:,} prompts of "
                             f"{MAX_PAIRS:,} lines (a prompt's tokens grow with the lines; an ablation scan reruns every "
                             f"prompt once per head); build several smaller tasks instead")
        if n_samples * n_pairs > MAX_LINES:
            raise InputError(f"KVRetrieval({n_pairs}, {n_samples}) asks for {n_samples * n_pairs:,} dictionary lines, more "
                             f"than {MAX_LINES:,} (n_pairs x n_samples; every prompt is built and tokenized before the "
                             f"first forward): lower n_samples or n_pairs, or build several smaller tasks")
        if isinstance(max_value, bool) or not isinstance(max_value, Integral):
            raise InputError(f"max_value must be an integer, got {max_value!r:.60}")
        if not 0 <= max_value <= MAX_VALUE:
            raise InputError(f"max_value must be in 0..{MAX_VALUE:,} (values are the integers 0..max_value), got "
                             f"{max_value!r:.40}")
        if n_pairs > max_value + 1:
            raise InputError(
                f"n_pairs={n_pairs} needs {n_pairs} distinct values but values are the integers 0..{max_value} "
                f"({max_value + 1} distinct); lower n_pairs or raise max_value"
            )
        if n_pairs > len(keys):
            raise InputError(f"n_pairs={n_pairs} needs {n_pairs} distinct keys but the word list has {len(keys)}; "
                             f"lower n_pairs or pass a longer `words` list")
        bad = [w for w in keys if not w or any(c in w for c in ":\n'")]
        if bad:
            raise InputError(f"keys may not be empty or contain ':', newlines or quotes: {bad[:5]}")
        self.n_pairs, self.seed, self.template, self.max_value = n_pairs, seed, template, max_value
        self.words = None if words is None else keys  # None: the shipped word list
        self.value_suffix = DEFAULT_VALUE_SUFFIX[template]
        super().__init__(f"kv{n_pairs}-{template}", [self._sample(i, keys) for i in range(n_samples)])

    def with_value_suffix(self, value_suffix: str | None) -> "KVRetrieval":
        """The same dictionaries and queries with ``value_suffix`` after each value in the candidates (None: the
        template's own, ``""`` for ``official``, ``"\\n"`` for ``completion``); this task is left as it was."""
        if value_suffix is not None and not isinstance(value_suffix, str):
            raise InputError(f"value_suffix must be a string (what follows each value in the candidates) or None, got "
                             f"{type(value_suffix).__name__}")
        out = copy.copy(self)
        out.value_suffix = DEFAULT_VALUE_SUFFIX[self.template] if value_suffix is None else value_suffix
        keys = word_list() if self.words is None else self.words
        Task.__init__(out, self.name, [out._sample(i, keys) for i in range(len(self))])
        return out

    def to_dict(self) -> dict[str, Any]:
        """The constructor's arguments (``kind: "kv"``); the seeded rebuild gives identical samples."""
        args = {"n_pairs": self.n_pairs, "n_samples": len(self), "seed": self.seed, "template": self.template,
                "max_value": self.max_value, "words": None if self.words is None else list(self.words),
                "value_suffix": self.value_suffix}
        return {"format_version": FORMAT_VERSION, "kind": "kv", "name": self.name, "n_samples": len(self),
                "args": args}

    def _sample(self, i: int, keys: Sequence[str]) -> Sample:
        rng = StableRng("kv", self.seed, i)
        ks = rng.sample(keys, self.n_pairs)
        vs = rng.sample(range(self.max_value + 1), self.n_pairs)
        q = rng.below(self.n_pairs)
        b = TextBuilder()
        b.add(HEADER)
        lines = [b.add(f"{k}:{v}\n") for k, v in zip(ks, vs)]
        cue_start = b.position
        if self.template == "official":
            b.add("The value of the key '")
            query = b.add(ks[q])
            b.add("' is")
            cands = tuple(f" {v}{self.value_suffix}" for v in vs)
        else:
            query = b.add(ks[q])
            b.add(":")
            cands = tuple(f"{v}{self.value_suffix}" for v in vs)
        return Sample(b.text, cands, q, CharSegments(tuple(lines), query), cue_start,
                      {"n_pairs": self.n_pairs, "key": ks[q], "value": vs[q], "depth": q, "template": self.template})


def _check_words(words: Sequence[str]) -> tuple[str, ...]:
    """``words`` as distinct keys in order; a lone string or a non-string item is an error."""
    if isinstance(words, (str, bytes)):
        raise InputError(f"words={words!r} is a single string, whose letters would become the keys; "
                         f"pass a list of words, e.g. words=[{words!r}, 'river', ...]")
    try:
        items = list(words)
    except TypeError:
        raise InputError(f"words={words!r} is a {type(words).__name__}, not a list; pass a list of words") from None
    bad = [w for w in items if not isinstance(w, str)]
    if bad:
        raise InputError(f"words must all be strings, got {bad[:5]!r} "
                         f"({', '.join(sorted({type(w).__name__ for w in bad}))}); pass a list of words")
    return tuple(dict.fromkeys(items))
