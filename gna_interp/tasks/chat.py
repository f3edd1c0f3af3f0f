"""Chat-template variant of any task: the context becomes the user turn, the cue opens the reply."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gna_interp.errors import InputError
from gna_interp.tasks.sample import Sample
from gna_interp.tasks.segments import CharSpan


def wrap_chat(sample: Sample, tokenizer: Any, system: str | None = None) -> Sample:
    """Wrap ``sample.prompt[:cue_start]`` in ``tokenizer``'s chat template; keep the cue as the reply's start.

    Character spans are moved to where their text lands in the templated prompt. Templates that trim
    the message are handled: spans are clipped to the text that survives.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"{type(tokenizer).__name__} has no chat template; drop the chat option for this model")
    context, cue = sample.prompt[: sample.cue_start], sample.prompt[sample.cue_start:]
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
               [{"role": "user", "content": context}]
    head = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    kept_from, kept_to = 0, len(context)
    at = head.find(context)
    if at < 0:  # the template trims the message
        stripped = context.strip()
        at = head.find(stripped) if stripped else -1
        if at < 0:
            raise InputError("the chat template rewrites the prompt text, so its segments cannot be located; "
                             "use the plain (non-chat) prompt format for this model")
        kept_from = len(context) - len(context.lstrip())
        kept_to = kept_from + len(stripped)
        at -= kept_from
    cue_at = len(head)

    def move(span: CharSpan) -> CharSpan:
        a, b = span
        if a >= sample.cue_start:
            return a - sample.cue_start + cue_at, b - sample.cue_start + cue_at
        a, b = max(a, kept_from), min(b, kept_to)
        if a >= b:
            raise InputError(f"the chat template drops the segment {context[span[0]:span[1]]!r}")
        return a + at, b + at

    return replace(sample, prompt=head + cue, spans=sample.spans.map(move), cue_start=cue_at,
                   meta={**dict(sample.meta), "chat": True})
