"""`compare_heads(...)`: one sample seen by two heads side by side (e.g. attention vs SSM), with sharpness."""

from __future__ import annotations

import html
import math
from typing import Any

from gna_interp.models.heads import HeadRef
from gna_interp.mixing.pattern_set import PatternSet
from gna_interp.mixing.sharpness import sharpness
from gna_interp.options import Options, options
from gna_interp.viz.attention import display_rows
from gna_interp.viz.text import clip

_MAX_TICK_TOKENS = 40
_CHAR_PX = 5.5  # the width of a character of a 9-px tick label
_HEIGHT = 940


def _tick(token: str, pos: int) -> str:
    """An axis label: the position and the token (newlines visible), cut only between words."""
    shown = token.replace("\n", "\\n") or "\u2205"
    return f"{pos}:{clip(shown, 10)}"


def _spacing(ticks: list[list[str]]) -> dict[str, float]:
    """The subplot gaps that leave room for the longest tick label (its words are never cut): between the two
    heatmaps for the right one's labels and axis title, below them for the slanted key labels and their title."""
    room = _CHAR_PX * max((len(t) for tk in ticks for t in tk), default=0)
    return {"horizontal_spacing": max(0.1, (room + 45) / 1000),
            "vertical_spacing": max(0.14, (0.9 * room + 55) / _HEIGHT)}


def _stats(pattern: Any, final: int) -> dict[str, float]:
    """Sharpness of a ``[q, k]`` pattern: means over query rows 1.. (row 0 has one key, entropy 0 by
    construction) and the values of the ``final`` row."""
    s = sharpness(pattern)

    def mean(t: Any) -> float:
        return float(t[1:].nanmean()) if t.shape[0] > 1 else math.nan

    return {"mean entropy (nats)": mean(s.entropy), "mean top-1 mass": mean(s.top1),
            "mean support exp(H)": mean(s.support), "final-row entropy (nats)": float(s.entropy[final]),
            "final-row top-1 mass": float(s.top1[final]), "final-row support": float(s.support[final])}


@options
class FigureText(Options):
    """Text of a :func:`compare_heads` figure: the two panels' ``labels`` (default: the heads' names and kinds) and
    its ``title``."""

    labels: tuple[str, str] | None = None
    title: str | None = None


def _form_note(label: str, form: str | None, head: HeadRef) -> str:
    """`` · form=F`` after a panel's label for a head whose pattern has forms, unless the label says it already."""
    if not form or head.adapter.normalized_rows or f"form={form}" in label:
        return ""
    return f" · form={form}"


def compare_heads(left: PatternSet, left_head: HeadRef | str, right: PatternSet, right_head: HeadRef | str,
                  sample: int = 0, text: FigureText | None = None, **overrides: Any) -> Any:
    """Plotly figure: ``left_head`` of ``left`` and ``right_head`` of ``right`` on sample ``sample``,
    as two heatmaps (query row x key column), with a table of their sharpness numbers below.

    The two pattern sets may come from two models (a Transformer and an SSM fed the same prompt) or be
    the same set (a hybrid). Sharpness (:func:`gna_interp.mixing.sharpness.sharpness`) treats each row
    as ``|A| / Σ|A|`` over the causal keys -- exactly what is drawn -- and is reported as the mean over
    query rows (row 0 excluded) and for the final row. ``text`` (:class:`FigureText`) or keyword ``overrides``
    of its fields: ``labels`` (default: the heads' names and kinds) and ``title``.
    """
    shown = FigureText.build(text, **overrides)
    labels, title = shown.labels, shown.title
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    hs = (HeadRef.parse(left_head), HeadRef.parse(right_head))
    sets = (left, right)
    names = labels or tuple(f"{h.name} ({h.adapter.label})" for h in hs)
    form = {i: s.options.form for i, s in enumerate(sets)}
    mats, stats, toks = [], [], []
    for i, (ps, h) in enumerate(zip(sets, hs)):
        pat = display_rows(ps.sample(sample, [h]), [h])[0].cpu()
        mats.append(pat)
        stats.append(_stats(pat, pat.shape[0] - 1))
        toks.append(ps.str_tokens[sample])
    ticks = [[_tick(t, p) for p, t in enumerate(tk)] for tk in toks]
    fig = make_subplots(rows=2, cols=2, row_heights=[0.66, 0.34], **_spacing(ticks),
                        specs=[[{"type": "heatmap"}, {"type": "heatmap"}], [{"type": "table", "colspan": 2}, None]],
                        subplot_titles=[html.escape(n, quote=False) + _form_note(n, form[i], hs[i])
                                        for i, n in enumerate(names)])
    for c, (pat, tk) in enumerate(zip(mats, ticks), start=1):
        fig.add_trace(go.Heatmap(z=pat.numpy(), x=tk, y=tk, coloraxis="coloraxis",
                                 hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>"), row=1, col=c)
        ticks_kw = dict(nticks=min(len(tk), _MAX_TICK_TOKENS), tickfont=dict(size=9))
        fig.update_xaxes(title_text="key position: token", tickangle=-60, **ticks_kw, row=1, col=c)
        fig.update_yaxes(title_text="query position: token", autorange="reversed", **ticks_kw, row=1, col=c)
    keys = list(stats[0])
    cells = [keys] + [[f"{s[k]:.3f}" for k in keys] for s in stats]
    fig.add_trace(go.Table(header=dict(values=["sharpness", *(html.escape(n, quote=False) for n in names)], fill_color="#eef2f7", align="left"),
                           cells=dict(values=cells, align="left")), row=2, col=1)
    fig.update_layout(title=dict(text=title or f"Same sample, two heads: {hs[0].name} vs {hs[1].name}"),
                      coloraxis=dict(colorscale="Viridis", cmin=0, colorbar=dict(title=dict(text="row share"), len=0.6, y=0.7)),
                      height=_HEIGHT, template="plotly_white", margin=dict(l=70, r=40, t=90, b=30))
    return fig
