"""Segment annotation from character offsets: where each line, the query and the final token sit.

A task builds its prompt with :class:`TextBuilder`, which records *character* spans (tokenizer-free).
:func:`annotate` maps them onto the token positions of any tokenizer through its offset mapping, so
BPE, SentencePiece and byte-level tokenizers are handled alike:

- ``items[i]``: token span of line ``i`` (a dictionary line ``"apple:42\\n"``, an option line
  ``"B. Access Point\\n"``); ``items[i].summary`` is its last token (usually the newline), where a
  Gather head condenses the line;
- ``query``: token span of the queried key (KV) or of the question (multiple choice);
- ``final``: the last prompt token, whose next-token prediction is scored (an Aggregate head
  attends from here to the summary tokens).

Positions index the prompt's own (unpadded) tokens; :meth:`Segments.shifted` moves them into a
left-padded batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from gna_interp.errors import InputError
from gna_interp.models.tokens import CharSpan, token_offsets, token_offsets_all


@dataclass(frozen=True)
class CharSegments:
    """Character spans (end-exclusive) of a prompt's lines and its query."""

    items: tuple[CharSpan, ...] = ()
    query: CharSpan | None = None

    def map(self, fn: Callable[[CharSpan], CharSpan]) -> "CharSegments":
        """Apply ``fn(span) -> span`` to every span."""
        return CharSegments(tuple(fn(s) for s in self.items), fn(self.query) if self.query else None)


class TextBuilder:
    """Concatenate text pieces while recording the character span of each piece."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._len = 0

    def add(self, text: str) -> CharSpan:
        """Append ``text``; return its ``(start, end)`` in the final string."""
        start = self._len
        self._parts.append(text)
        self._len += len(text)
        return start, self._len

    @property
    def position(self) -> int:
        return self._len

    @property
    def text(self) -> str:
        return "".join(self._parts)


@dataclass(frozen=True)
class Span:
    """Token positions ``[start, stop)``; ``summary`` is the last one."""

    start: int
    stop: int

    @property
    def summary(self) -> int:
        return self.stop - 1

    def __len__(self) -> int:
        return self.stop - self.start

    def shifted(self, offset: int) -> "Span":
        return Span(self.start + offset, self.stop + offset)


@dataclass(frozen=True)
class Segments:
    """Token-level segments of one prompt under one tokenizer.

    Attributes:
        items: one span per line / option, in prompt order (``candidates[i]`` belongs to ``items[i]``).
        query: span of the queried key (KV) or of the question (multiple choice); ``None`` if absent.
        final: position of the last prompt token (the one whose prediction is scored).
        n_tokens: number of prompt tokens.
        aligned: every span starts and ends on a token boundary (ignoring whitespace that a token
            carries with it); ``False`` when a token straddles a segment boundary.
    """

    items: tuple[Span, ...]
    query: Span | None
    final: int
    n_tokens: int
    aligned: bool

    @property
    def summaries(self) -> list[int]:
        """Summary-token position of every item."""
        return [s.summary for s in self.items]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (see :meth:`from_dict`)."""
        return {"items": [[s.start, s.stop] for s in self.items],
                "query": [self.query.start, self.query.stop] if self.query else None,
                "final": self.final, "n_tokens": self.n_tokens, "aligned": self.aligned}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Segments":
        """The segments :meth:`to_dict` described."""
        q = d.get("query")
        return cls(tuple(Span(int(a), int(b)) for a, b in d["items"]), Span(int(q[0]), int(q[1])) if q else None,
                   int(d["final"]), int(d["n_tokens"]), bool(d["aligned"]))

    def shifted(self, offset: int) -> "Segments":
        """The same segments ``offset`` positions later (e.g. behind ``offset`` left-padding tokens)."""
        return replace(self, items=tuple(s.shifted(offset) for s in self.items),
                       query=self.query.shifted(offset) if self.query else None,
                       final=self.final + offset, n_tokens=self.n_tokens + offset)


def _token_span(text: str, offsets: list[CharSpan], span: CharSpan) -> tuple[Span, bool]:
    a, b = span
    hit = [i for i, (s, e) in enumerate(offsets) if s < e and s < b and e > a]
    if not hit:
        raise InputError(f"characters {a}:{b} ({text[a:b]!r}) map to no token; is the span empty?")
    first, last = hit[0], hit[-1]
    s0, e1 = offsets[first][0], offsets[last][1]
    aligned = (s0 >= a or text[s0:a].isspace()) and (e1 <= b or text[b:e1].isspace())
    return Span(first, last + 1), aligned


def segments_of(tokenizer: Any, samples: Sequence[Any]) -> list[Segments]:
    """Each sample's segments under ``tokenizer`` (``sample.segments(tokenizer)``), every prompt tokenized in one
    call."""
    tokens = token_offsets_all(tokenizer, [s.prompt for s in samples])
    return [annotate(tokenizer, s.prompt, s.spans, t) for s, t in zip(samples, tokens)]


def annotate(tokenizer: Any, text: str, spans: CharSegments,
             tokens: tuple[list[int], list[CharSpan]] | None = None) -> Segments:
    """Map character spans of ``text`` onto ``tokenizer``'s token positions (``tokens``: ``text``'s
    :func:`~gna_interp.models.tokens.token_offsets`, when already computed)."""
    ids, offsets = tokens if tokens is not None else token_offsets(tokenizer, text)
    if not ids:
        raise InputError("the prompt tokenizes to nothing; pass non-empty text")
    items, ok = [], True
    for cs in spans.items:
        sp, al = _token_span(text, offsets, cs)
        items.append(sp)
        ok &= al
    query = None
    if spans.query is not None:
        query, al = _token_span(text, offsets, spans.query)
        ok &= al
    return Segments(tuple(items), query, len(ids) - 1, len(ids), ok)
