"""`Sample`: one prompt, its candidate continuations, the gold index, character spans and facts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from gna_interp.errors import InputError
from gna_interp.tasks.segments import CharSegments, Segments, annotate

JSON_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Sample:
    """One prompt with its candidate continuations.

    Attributes:
        prompt: the text fed to the model; the scored position is its last token.
        candidates: continuations to score (e.g. ``" 42"``, ``" B"``), distinct and non-empty.
        gold: index of the correct candidate.
        spans: character spans of the lines/options (``candidates[i]`` belongs to ``spans.items[i]``
            when there are as many items as candidates) and of the query.
        cue_start: where the answer cue (``"The value of the key 'K' is"``, ``"Answer:"``) starts;
            ``prompt[:cue_start]`` is the context, which a chat template wraps as the user turn.
        meta: task-specific facts (key, value, subject, ...), copied into per-sample tables; kept as
            a plain ``dict`` so that samples compare equal after a save and load.
    """

    prompt: str
    candidates: tuple[str, ...]
    gold: int
    spans: CharSegments = CharSegments()
    cue_start: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.candidates, str):
            raise InputError(f"candidates is the single string {self.candidates!r}; pass a tuple of continuations, "
                             f"e.g. (' 42', ' 7')")
        # Plain containers, so that equality does not depend on how a sample was built or loaded.
        object.__setattr__(self, "candidates", tuple(self.candidates))
        object.__setattr__(self, "meta", dict(self.meta))
        if isinstance(self.spans, CharSegments):
            object.__setattr__(self, "spans", CharSegments(
                tuple(tuple(s) for s in self.spans.items),
                None if self.spans.query is None else tuple(self.spans.query)))
        if not self.candidates:
            raise InputError("a sample needs at least one candidate")
        if len(set(self.candidates)) != len(self.candidates):
            raise InputError(f"candidates must be distinct, got {list(self.candidates)}")
        empty = [c for c in self.candidates if c == ""]
        if empty:
            raise InputError(f"empty candidate in {list(self.candidates)}: every candidate needs some text")
        if not 0 <= self.gold < len(self.candidates):
            raise InputError(f"gold={self.gold} is not an index into {len(self.candidates)} candidates")
        if not 0 <= self.cue_start <= len(self.prompt):
            raise InputError(f"cue_start={self.cue_start} lies outside the prompt ({len(self.prompt)} chars)")

    @property
    def answer(self) -> str:
        """The gold candidate's text."""
        return self.candidates[self.gold]

    def segments(self, tokenizer: Any) -> Segments:
        """Token-level segments of this prompt under ``tokenizer``."""
        return annotate(tokenizer, self.prompt, self.spans)

    def to_dict(self) -> dict[str, Any]:
        """This sample as strict-JSON data (no NaN); :func:`gna_interp.tasks.io.sample_from_dict` reads it back.

        ``meta`` values must be JSON scalars (str, int, float, bool, None); NumPy scalars are converted.
        """
        return {"prompt": self.prompt, "candidates": list(self.candidates), "gold": int(self.gold),
                "spans": {"items": [[int(a), int(b)] for a, b in self.spans.items],
                          "query": None if self.spans.query is None else [int(x) for x in self.spans.query]},
                "cue_start": int(self.cue_start),
                "meta": {_meta_key(k): _meta_value(k, v) for k, v in self.meta.items()}}


def _meta_key(key: Any) -> str:
    if not isinstance(key, str):
        raise InputError(f"sample meta key {key!r} is a {type(key).__name__}; meta keys must be strings to be saved")
    return key


def _meta_value(key: str, value: Any) -> Any:
    if not isinstance(value, JSON_SCALARS) and hasattr(value, "item"):  # NumPy / torch scalars
        value = value.item()
    if not isinstance(value, JSON_SCALARS):
        raise InputError(f"sample meta {key!r} = {value!r} is a {type(value).__name__}, not a JSON scalar; "
                         f"store a str, int, float, bool or None in meta to save the task")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"sample meta {key!r} = {value!r} is not a finite number, which strict JSON cannot hold; "
                         f"store None (or a string) instead")
    return value
