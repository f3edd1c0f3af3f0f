"""The task interface: a :class:`Task` is a named, immutable list of :class:`Sample` objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import pandas as pd

from gna_interp.errors import InputError
from gna_interp.tasks.segments import CharSegments, Segments, annotate


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
        meta: task-specific facts (key, value, subject, ...), copied into per-sample tables.
    """

    prompt: str
    candidates: tuple[str, ...]
    gold: int
    spans: CharSegments = CharSegments()
    cue_start: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
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


class Task:
    """A named list of samples. Subclasses (``KVRetrieval``, ``MultipleChoice``) build theirs."""

    def __init__(self, name: str, samples: Sequence[Sample]) -> None:
        if not samples:
            raise InputError(f"task {name!r} has no samples; ask for at least one")
        self.name = name
        self.samples: tuple[Sample, ...] = tuple(samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    def __getitem__(self, i: int) -> Sample:
        return self.samples[i]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, n_samples={len(self)})"

    @property
    def prompts(self) -> list[str]:
        return [s.prompt for s in self.samples]

    @property
    def chance(self) -> float:
        """Accuracy of guessing uniformly among each sample's candidates."""
        return sum(1 / len(s.candidates) for s in self.samples) / len(self.samples)

    def segments(self, tokenizer: Any) -> list[Segments]:
        """Token-level segments of every sample under ``tokenizer``."""
        return [s.segments(tokenizer) for s in self.samples]

    def with_chat_template(self, tokenizer: Any, system: str | None = None) -> "Task":
        """This task with each context wrapped as a chat user turn and the cue opening the reply."""
        from gna_interp.tasks.chat import wrap_chat

        return Task(f"{self.name}+chat", [wrap_chat(s, tokenizer, system) for s in self.samples])

    def to_frame(self) -> pd.DataFrame:
        """One row per sample: ``sample, prompt, answer, n_candidates`` plus the sample's ``meta``."""
        return pd.DataFrame([{"sample": i, "prompt": s.prompt, "answer": s.answer,
                              "n_candidates": len(s.candidates), **dict(s.meta)}
                             for i, s in enumerate(self.samples)])
