"""circuitsvis views of per-head patterns (attention and SSM implicit attention)."""

from __future__ import annotations

from typing import Sequence

from jaxtyping import Float
from torch import Tensor

from gna_interp.circuits.search.views import row_normalised
from gna_interp.models.heads import HeadRef
from gna_interp.mixing.pattern_set import PatternSet
from gna_interp.viz.html import HTMLView, circuitsvis_widget, display_tokens, render


def display_rows(pattern: Float[Tensor, "n q k"], heads: Sequence[HeadRef]) -> Float[Tensor, "n q k"]:
    """Patterns as shown: attention heads as they are (rows sum to 1); SSM heads' implicit attention
    as ``|M| / sum_k |M|`` per row, so every head is drawn on the same 0..1 scale
    (:func:`gna_interp.circuits.search.views.row_normalised`, which the stored all-head patterns use too)."""
    return row_normalised(pattern, heads)


def attention_heads(patterns: PatternSet, heads: Sequence[HeadRef | str] | None = None,
                    sample: int = 0) -> HTMLView:
    """circuitsvis ``AttentionHeads`` widget for ``heads`` on sample ``sample``, as an :class:`HTMLView`.

    Shows itself in a notebook (bundle inlined, no network); ``.save(path)`` writes a standalone page;
    ``str(view)`` is the bare fragment, which needs the circuitsvis bundle on the page
    (:func:`gna_interp.viz.html.page` adds it for views). Head names follow :class:`HeadRef`
    (``L16H22``, ``L3S5``, ``L35C3186``).
    """
    hs = [HeadRef.parse(h) for h in (heads if heads is not None else patterns.heads)]
    pat = display_rows(patterns.sample(sample, hs), hs)
    widget = circuitsvis_widget("AttentionHeads", attention=pat.cpu().numpy(), tokens=display_tokens(patterns.str_tokens[sample]),
                                attentionHeadNames=[h.name for h in hs])
    names = ", ".join(h.name for h in hs[:8]) + (" ..." if len(hs) > 8 else "")
    return HTMLView(widget, title=f"patterns: {names}", circuitsvis=True, heading=False)


def patterns_page(patterns: PatternSet, title: str, heads: Sequence[HeadRef | str] | None = None,
                  sample: int = 0, note: str = "") -> HTMLView:
    """The circuitsvis view of ``heads`` with the prompt and a note, as an :class:`HTMLView` titled ``title``.

    ``.save(path)`` writes the standalone page (renders with no network), ``.page()`` is that page as a
    string, ``str(view)`` the body fragment; in a notebook the view shows itself.
    """
    hs = [HeadRef.parse(h) for h in (heads if heads is not None else patterns.heads)]
    text = "".join(patterns.str_tokens[sample])
    intro = render("patterns_intro.html", note=note, n_tokens=len(patterns.str_tokens[sample]), text=text)
    return HTMLView(intro + "\n" + attention_heads(patterns, hs, sample).fragment, title=title, circuitsvis=True)
