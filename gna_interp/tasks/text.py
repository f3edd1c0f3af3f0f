"""Plain-text language modelling, the control that needs no in-context retrieval.

A G&A head's removal collapses retrieval while ordinary language modelling barely moves; a head the
whole network leans on (typically in layers 0-2) hurts both. :class:`NeutralText` turns paragraphs of
neutral prose (``gna_interp/data/neutral.txt``, written for this package: a town, bread, bees, a
lighthouse...) into samples whose single candidate is the paragraph's continuation, so the scoring
engine's gold score is the summed log-probability of the continuation's tokens and the **LM loss**
is ``−Σ gold score / Σ tokens`` (nats per token). Every scan strategy then measures it per ablated
head exactly like a task metric (``metric="logprob"``).
"""

from __future__ import annotations

from pathlib import Path

from gna_interp.errors import InputError
from gna_interp.tasks.base import Task
from gna_interp.tasks.sample import Sample
from gna_interp.engine.plan import CandidateScores
from gna_interp.engine.metrics import LOGPROB, raw

NEUTRAL_FILE = Path(__file__).resolve().parent.parent / "data" / "neutral.txt"

__all__ = ["NEUTRAL_FILE", "NeutralText", "lm_loss"]


class NeutralText(Task):
    """One sample per paragraph of ``text`` (default: the shipped neutral prose): the first
    ``prompt_words`` words are the prompt, the rest of the paragraph (with its leading space) the single
    candidate. ``n_paragraphs`` keeps the first paragraphs only (None: all)."""

    def __init__(self, text: str | None = None, prompt_words: int = 4, n_paragraphs: int | None = None) -> None:
        if text is not None and not isinstance(text, str):
            raise InputError(f"text must be a string of paragraphs separated by blank lines, got {type(text).__name__}")
        if isinstance(prompt_words, bool) or not isinstance(prompt_words, int) or prompt_words < 1:
            raise InputError(f"prompt_words must be an integer >= 1, got {prompt_words!r}")
        raw = NEUTRAL_FILE.read_text(encoding="utf-8") if text is None else text
        paragraphs = [" ".join(p.split()) for p in raw.split("\n\n") if p.strip()]
        paragraphs = [p for p in paragraphs if len(p.split()) > prompt_words]
        if n_paragraphs is not None:
            paragraphs = paragraphs[:n_paragraphs]
        if not paragraphs:
            raise InputError(f"no paragraph of the text has more than prompt_words={prompt_words} words")
        samples = []
        for i, p in enumerate(paragraphs):
            words = p.split(" ")
            prompt, rest = " ".join(words[:prompt_words]), " " + " ".join(words[prompt_words:])
            samples.append(Sample(prompt, (rest,), 0, meta={"paragraph": i, "words": len(words)}))
        super().__init__("neutral-text" if text is None else "text", samples)


def lm_loss(scores: CandidateScores) -> float:
    """LM loss in nats per token of the gold continuations scored in ``scores`` (e.g. of a :class:`NeutralText`)."""
    return -LOGPROB.value(raw(scores))
