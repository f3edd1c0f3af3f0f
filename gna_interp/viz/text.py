"""Words on the figures and pages: labels cut between words, counts whose noun agrees with the number."""

from __future__ import annotations

import re

from gna_interp.html_repr import counted

__all__ = ["ELLIPSIS", "agree", "clip", "counted"]

ELLIPSIS = "\u2026"
# nouns the pages count; a sentence written elsewhere saying "1 <noun>s" is put in the singular by agree()
_COUNTED = ("head", "MLP", "edge", "node", "layer", "prompt", "sample", "form", "draw", "seed", "token", "word",
            "item", "line", "pair", "kind", "channel", "group", "format", "task", "row", "column", "candidate")
_ONE_PLURAL = re.compile(rf"(?<![\w.,+-])1 ({'|'.join(_COUNTED)})s\b")


def _inside_word(text: str, i: int) -> bool:
    """Whether position ``i`` of ``text`` falls between two letters or digits (a cut there would split a word)."""
    return 0 < i < len(text) and text[i - 1].isalnum() and text[i].isalnum()


def clip(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, cut at a word boundary and ended with an ellipsis; a first word
    longer than that is kept whole (a label is never cut inside a word)."""
    if len(text) <= limit:
        return text
    cuts = [i for i in range(1, len(text)) if not _inside_word(text, i) and text[:i].strip()]
    if not cuts:
        return text
    fits = [i for i in cuts if i < limit]  # room for the ellipsis
    return text[:fits[-1] if fits else cuts[0]].rstrip() + ELLIPSIS


def agree(text: str) -> str:
    """A sentence written elsewhere with its counts of one in the singular (``1 MLPs`` -> ``1 MLP``)."""
    return _ONE_PLURAL.sub(r"1 \1", text)
