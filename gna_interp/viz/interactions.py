"""`interaction_heatmap(result)`: the k x k pairwise interactions of heads, single drops on the diagonal."""

from __future__ import annotations

import html
import math
from typing import Any

from gna_interp.circuits.scan.interactions import Interactions
from gna_interp.errors import InputError


def _fmt(v: float) -> str:
    return "" if math.isnan(v) else f"{v:.3g}"


def interaction_heatmap(result: Interactions | dict[str, Any], metric: str | None = None,
                        title: str | None = None) -> Any:
    """Plotly heatmap of :meth:`Interactions.matrix <gna_interp.circuits.scan.interactions.Interactions.matrix>`.

    Off the diagonal, ``interaction[i, j] = drop(i, j) - drop(i) - drop(j)`` on a diverging scale centred at 0
    (red: super-additive, the pair costs more than its singles; blue: sub-additive); cells whose bootstrap
    interval excludes 0 carry a ``*``. The diagonal holds each head's single drop, in grey (its own scale, so the
    interactions keep their contrast: darker = larger drop). Hover gives both drops, the pair drop, the interaction, its interval and
    kind. ``result``: an :class:`Interactions` or its :meth:`~Interactions.to_dict`; ``metric``: read another
    metric off the same per-sample results.
    """
    import plotly.graph_objects as go

    if isinstance(result, dict):
        result = Interactions.from_dict(result)
    if not isinstance(result, Interactions):
        raise InputError(f"expected an Interactions result (or its to_dict()), got {type(result).__name__}")
    name = metric or result.metric
    mat = result.matrix(metric).tolist()
    k = result.k
    names = [h.name for h in result.heads]
    frame = result.to_frame(metric).set_index(["head_i", "head_j"])
    off = [[math.nan] * k for _ in range(k)]
    diag = [[math.nan] * k for _ in range(k)]
    text = [[""] * k for _ in range(k)]
    dtext = [[""] * k for _ in range(k)]
    hover = [[""] * k for _ in range(k)]
    for i in range(k):
        diag[i][i] = mat[i][i]
        dtext[i][i] = _fmt(mat[i][i])
        hover[i][i] = f"<b>{html.escape(names[i])}</b><br>single drop: {_fmt(mat[i][i])}"
        for j in range(k):
            if i == j:
                continue
            a, b = (i, j) if i < j else (j, i)
            row = frame.loc[(names[a], names[b])]
            off[i][j] = mat[i][j]
            text[i][j] = _fmt(mat[i][j]) + ("*" if row["kind"] != "additive" else "")
            hover[i][j] = (f"<b>{html.escape(names[a])} + {html.escape(names[b])}</b>"
                           f"<br>drop {html.escape(names[a])}: {_fmt(row['drop_i'])}"
                           f"<br>drop {html.escape(names[b])}: {_fmt(row['drop_j'])}"
                           f"<br>drop together: {_fmt(row['drop_ij'])}"
                           f"<br>interaction: {_fmt(row['interaction'])} "
                           f"[{_fmt(row['low'])}, {_fmt(row['high'])}]<br>{row['kind']}")
    span = max([abs(v) for r in off for v in r if not math.isnan(v)] or [1.0]) or 1.0
    label = name.replace("_", " ")
    fig = go.Figure()
    fig.add_trace(go.Heatmap(z=off, x=names, y=names, text=text, texttemplate="%{text}", customdata=hover,
                             hovertemplate="%{customdata}<extra></extra>", colorscale="RdBu_r", zmid=0, zmin=-span,
                             zmax=span, xgap=2, ygap=2, name="interaction",
                             colorbar=dict(title=dict(text=f"interaction<br>({label})"))))
    top = max([abs(mat[i][i]) for i in range(k)] + [1e-12])
    fig.add_trace(go.Heatmap(z=diag, x=names, y=names, text=dtext, texttemplate="%{text}", customdata=hover,
                             hovertemplate="%{customdata}<extra></extra>", colorscale=[[0, "#f4f4f4"], [1, "#9a9a9a"]],
                             showscale=False, zmin=-top, zmax=top, xgap=2, ygap=2, name="single drop"))
    red = result.redundancy(metric)
    fig.update_layout(
        title=dict(text=title or f"Head interactions ({label}), redundancy {red:.2f}<br><sup>off the diagonal: "
                   f"drop(i,j) - drop(i) - drop(j), * interval excludes 0; diagonal: single drop</sup>"),
        xaxis=dict(title=dict(text="head j"), type="category"),
        yaxis=dict(title=dict(text="head i"), type="category", autorange="reversed"),
        height=int(220 + 60 * k), width=int(320 + 70 * k), template="plotly_white",
        margin=dict(l=80, r=40, t=80, b=60))
    return fig
