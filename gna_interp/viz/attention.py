"""circuitsvis views of per-head patterns (attention and SSM implicit attention)."""

from __future__ import annotations

import html
from typing import Sequence

from jaxtyping import Float
from torch import Tensor

from gna_interp.models.heads import HeadRef
from gna_interp.patterns.base import PatternSet
from gna_interp.viz.html import circuitsvis_widget, page


def display_rows(pattern: Float[Tensor, "n q k"], heads: Sequence[HeadRef]) -> Float[Tensor, "n q k"]:
    """Patterns as shown: attention heads as they are (rows sum to 1); SSM heads' implicit attention
    as ``|M| / sum_k |M|`` per row, so every head is drawn on the same 0..1 scale."""
    out = pattern.clone().float()
    for i, h in enumerate(heads):
        if h.kind != "attn":
            a = out[i].abs()
            out[i] = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
    return out


def attention_heads(patterns: PatternSet, heads: Sequence[HeadRef | str] | None = None, sample: int = 0) -> str:
    """circuitsvis ``AttentionHeads`` widget (HTML fragment) for ``heads`` on sample ``sample``.

    Head names follow :class:`HeadRef` (``L16H22``, ``L3S5``, ``L35C3186``). Needs the circuitsvis
    bundle on the page (:func:`gna_interp.viz.html.page` with ``circuitsvis=True``).
    """
    hs = [HeadRef.parse(h) for h in (heads if heads is not None else patterns.heads)]
    pat = display_rows(patterns.sample(sample, hs), hs)
    return circuitsvis_widget("AttentionHeads", attention=pat.cpu().numpy(), tokens=patterns.str_tokens[sample],
                              attentionHeadNames=[h.name for h in hs])


def patterns_page(patterns: PatternSet, title: str, heads: Sequence[HeadRef | str] | None = None,
                  sample: int = 0, note: str = "") -> str:
    """A standalone HTML page with the circuitsvis view of ``heads``; renders with no network."""
    hs = [HeadRef.parse(h) for h in (heads if heads is not None else patterns.heads)]
    text = "".join(patterns.str_tokens[sample])
    intro = (f'<p class="note">{html.escape(note)}</p>' if note else "") + \
        f"<p><b>Prompt</b> ({len(patterns.str_tokens[sample])} tokens):</p><pre>{html.escape(text)}</pre>" + \
        "<p class=\"note\">Attention heads: softmax pattern (rows sum to 1). SSM heads: implicit attention " \
        "shown row-normalised, |M[t,s]| / &Sigma;<sub>s</sub> |M[t,s]|. Hover a head to enlarge it; " \
        "click tokens to inspect.</p>"
    return page(title, [intro, attention_heads(patterns, hs, sample)], circuitsvis=True)
