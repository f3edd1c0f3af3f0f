"""The task interface: a :class:`Task` is a named, immutable list of :class:`Sample` objects."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import pandas as pd

from gna_interp.errors import InputError
from gna_interp.tasks.chat import wrap_chat
from gna_interp.tasks.sample import Sample
from gna_interp.tasks.segments import Segments, segments_of

__all__ = ["FORMAT_VERSION", "Sample", "Task"]

# Version of the dicts written by ``Task.to_dict``; ``task_from_dict`` reads versions 1..FORMAT_VERSION.
FORMAT_VERSION = 1


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
        return segments_of(tokenizer, self.samples)

    def with_chat_template(self, tokenizer: Any, system: str | None = None) -> "Task":
        """This task with each context wrapped as a chat user turn and the cue opening the reply."""
        return Task(f"{self.name}+chat", [wrap_chat(s, tokenizer, system) for s in self.samples])

    def to_frame(self) -> pd.DataFrame:
        """One row per sample: ``sample, prompt, answer, n_candidates`` plus the sample's ``meta``."""
        return pd.DataFrame([{"sample": i, "prompt": s.prompt, "answer": s.answer,
                              "n_candidates": len(s.candidates), **dict(s.meta)}
                             for i, s in enumerate(self.samples)])

    def to_dict(self) -> dict[str, Any]:
        """This task as strict-JSON data; :func:`gna_interp.tasks.task_from_dict` rebuilds it.

        A plain task stores its samples (``kind: "samples"``); ``KVRetrieval`` and ``MultipleChoice``
        store their arguments instead and are rebuilt through their constructors.
        """
        return {"format_version": FORMAT_VERSION, "kind": "samples", "name": self.name, "n_samples": len(self),
                "samples": [s.to_dict() for s in self.samples]}
