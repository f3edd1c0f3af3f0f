"""`ga_card(...)`: the G&A picture of one sample -- a gather head inside each segment, an aggregate head
from the final token over the segments and their summary tokens, and the gold and predicted answers."""

from __future__ import annotations

import html
import math
from typing import Any, Sequence

from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.mixing.pattern_set import PatternSet
from gna_interp.options import Options, options
from gna_interp.tasks.segments import Segments
from gna_interp.viz.attention import display_rows
from gna_interp.viz.text import clip

_GOLD, _PRED, _OTHER = "#2e8b57", "#c0392b", "#9aa5b1"


def _show(token: str) -> str:
    """A token as plotly text: newlines and tabs visible, markup escaped (plotly reads tags such as ``<a>``)."""
    return html.escape(token.replace("\n", "\\n").replace("\t", "\\t"), quote=False) or "\u2205"


@options
class CardAnswer(Options):
    """The answers a :func:`ga_card` marks, all optional: ``gold`` and ``pred`` item indices and ``candidates`` the
    answer texts (``candidates[i]`` belongs to item ``i``)."""

    gold: int | None = None
    pred: int | None = None
    candidates: Sequence[str] | None = None


def ga_card(patterns: PatternSet, gather: HeadRef | str, aggregate: HeadRef | str, segments: Segments,
            sample: int = 0, answer: CardAnswer | None = None, **overrides: Any) -> Any:
    """Plotly figure of one sample seen by a Gather head and an Aggregate head.

    Left: for every segment (one row per dictionary line / option), the ``gather`` head's weights
    from the segment's summary token onto each token of that segment, the token text written in its
    cell; the row label gives the share of the summary token's whole row that stays inside its own
    segment. Right: the ``aggregate`` head's final-row weight on each segment, split into the summary
    token (dark) and the rest of the segment (light, hatched); gold green, a wrong prediction red. SSM heads
    are shown as ``|M| / Σ|M|`` per row (as in :func:`~gna_interp.viz.attention.attention_heads`).

    ``segments`` index the sample's own tokens (``sample.segments(tokenizer)``); ``answer``
    (:class:`CardAnswer`) or keyword ``overrides`` of its fields: ``gold`` and ``pred`` item indices and
    ``candidates`` the answer texts (``candidates[i]`` belongs to item ``i``), all optional.
    """
    ans = CardAnswer.build(answer, **overrides)
    gold, pred, candidates = ans.gold, ans.pred, ans.candidates
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    g, a = HeadRef.parse(gather), HeadRef.parse(aggregate)
    tokens = patterns.str_tokens[sample]
    if segments.n_tokens != len(tokens):
        raise InputError(f"segments cover {segments.n_tokens} tokens but sample {sample} has {len(tokens)}; "
                         f"annotate the same prompt with the same tokenizer")
    if not segments.items:
        raise InputError("the segments have no items (lines / options): nothing to gather over")
    pats = display_rows(patterns.sample(sample, [g, a]), [g, a]).cpu()
    pg, pa = pats[0], pats[1]
    width = max(len(s) for s in segments.items)
    z, text, hover, labels = _gather_rows(pg, tokens, segments, gold, pred)
    final = segments.final
    summ = [float(pa[final, sp.summary]) for sp in segments.items]
    rest = [float(pa[final, sp.start:sp.summary].sum()) for sp in segments.items]
    total = [x + y for x, y in zip(summ, rest)]
    colours = [_GOLD if i == gold else _PRED if i == pred else _OTHER for i in range(len(summ))]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.6, 0.4], horizontal_spacing=0.03,
                        subplot_titles=[f"gather {g.name}: summary token → own segment",
                                        f"aggregate {a.name}: final → segments ({sum(total):.0%} of its row)"])
    ys = list(range(len(labels)))
    fig.add_trace(go.Heatmap(z=z, x=list(range(width)), y=ys, text=text, texttemplate="%{text}", customdata=hover,
                             hovertemplate="%{customdata}<br>weight %{z:.3f}<extra></extra>", colorscale="Blues",
                             zmin=0, zmax=1, xgap=2, ygap=2,
                             colorbar=dict(title=dict(text="weight"), x=1.02, len=0.8)), row=1, col=1)
    fig.add_trace(go.Bar(x=summ, y=ys, orientation="h", marker_color=colours, name="on the summary token",
                         customdata=labels, hovertemplate="%{customdata}<br>on the summary token %{x:.3f}<extra></extra>"),
                  row=1, col=2)
    fig.add_trace(go.Bar(x=rest, y=ys, orientation="h", marker=dict(color=colours, opacity=0.4,
                                                                     pattern=dict(shape="/", solidity=0.5)),
                         name="on the rest of the segment", text=[f"{v:.3f}" for v in total], textposition="outside",
                         cliponaxis=False, customdata=labels,
                         hovertemplate="%{customdata}<br>on the rest of the segment %{x:.3f}<extra></extra>"),
                  row=1, col=2)
    fig.update_yaxes(tickvals=ys, ticktext=labels, autorange="reversed", title_text="segment", row=1, col=1)
    fig.update_xaxes(title_text="token within segment", tickvals=list(range(width)), row=1, col=1)
    fig.update_xaxes(title_text=f"weight from final token {_show(tokens[final])!r}",
                     range=[0, max(0.05, max(total)) * 1.25], row=1, col=2)
    fig.update_layout(title=dict(text=_answer_title(g, a, gold, pred, candidates)), barmode="stack",
                      height=int(200 + 26 * len(labels)), template="plotly_white", margin=dict(l=190, r=90, t=110, b=60),
                      legend=dict(orientation="h", yanchor="top", y=-0.2 - 6 / (len(labels) + 6), x=0.6))
    return fig


def _gather_rows(pg: Any, tokens: list[str], segments: Segments, gold: int | None,
                 pred: int | None) -> tuple[list[list[float]], list[list[str]], list[list[str]], list[str]]:
    """The gather panel: per segment its summary token's weights on the segment's tokens (``z``, padded with NaN),
    the tokens (``text``), the hover texts and the row label (the segment cut between words, its share, gold/pred)."""
    width = max(len(s) for s in segments.items)
    z, text, hover, labels = [], [], [], []
    for i, span in enumerate(segments.items):
        seg = [float(pg[span.summary][p]) for p in range(span.start, span.stop)]
        pad = [""] * (width - len(seg))
        z.append(seg + [math.nan] * (width - len(seg)))
        text.append([_show(tokens[p]) for p in range(span.start, span.stop)] + pad)
        hover.append([f"{_show(tokens[p])} (pos {p}) ← summary pos {span.summary}" for p in
                      range(span.start, span.stop)] + pad)
        segment_text = "".join(tokens[span.start:span.stop]).strip()
        tag = " ★gold" if i == gold else " ✗pred" if i == pred else ""
        labels.append(f"{i}: {html.escape(clip(segment_text, 24), quote=False)} ({sum(seg):.0%} in){tag}")
    return z, text, hover, labels


def _answer_title(g: HeadRef, a: HeadRef, gold: int | None, pred: int | None,
                  candidates: Sequence[str] | None) -> str:
    head = f"G&amp;A card: gather {g.name}, aggregate {a.name}"
    parts = []

    def say(i: int) -> str:
        return f"{html.escape(repr(candidates[i]), quote=False)} (segment {i})" if candidates else f"segment {i}"
    if gold is not None:
        parts.append(f"gold {say(gold)}")
    if pred is not None:
        ok = "" if gold is None else (" ✓" if pred == gold else " ✗")
        parts.append(f"predicted {say(pred)}{ok}")
    return head + (f"<br><sup>{' · '.join(parts)}</sup>" if parts else "")
