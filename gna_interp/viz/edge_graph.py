"""`edge_graph(screen)`: the whole graph's strongest edges (:class:`~gna_interp.circuits.edges.edge_screen.EdgeScreen`) --
the embeddings, heads, MLPs and the logits as nodes placed by layer, the edges as lines.

Heads are circles placed by layer, MLPs squares in a row of their own below them (between their layer and the next),
the embeddings and the logits diamonds at the two ends. An edge's width is its
exact effect where path patching measured it (solid) and its screened estimate otherwise (dotted); its colour is the
input it reaches (``q``, ``k``, ``v``, ``other``, an MLP's input, the logits), and its position class shows in the
hover text with both numbers. Edges that lower the metric's drop (negative effects) are drawn faint. Edges between
the same two nodes are bent apart and an edge bends around a node it would cross (:mod:`gna_interp.viz.layout`); the
x axis is ticked at the layers, ``embed`` and ``logits`` at the two ends.
"""

from __future__ import annotations

import math
from typing import Any

from gna_interp.errors import InputError
from gna_interp.models.graph import node_kind
from gna_interp.viz.graph import INPUT_COLOURS, draw_edges, node_positions
from gna_interp.viz.layout import Frame, layer_axis
from gna_interp.viz.text import counted

__all__ = ["edge_graph"]


def edge_graph(screen: Any, top: int = 40, title: str | None = None) -> Any:
    """Plotly figure of the ``top`` edges of ``screen``'s table by ``|effect|`` (exact where measured, else the
    screened score) and the nodes they join; edges between the same two nodes (a head's key and query read from
    one sender) are bent apart, and the x axis is ticked at the layers."""
    import plotly.graph_objects as go

    table = getattr(screen, "table", None)
    if table is None:
        raise InputError(f"edge_graph takes an EdgeScreen (gna_interp.circuits.edges.edge_screen), got {type(screen).__name__}")
    t = table.copy()
    t["value"] = t["effect"].where(t["effect"].notna(), t["score"])
    t = t.reindex(t["value"].abs().sort_values(ascending=False).index).head(top)
    names = sorted(set(t["sender"]) | set(t["receiver"]))
    pos = node_positions(names)
    area = Frame.around(pos, 520)
    fig = go.Figure()
    draw_edges(fig, [(r.sender, r.receiver, r.input) for r in t.itertuples()], pos, _styles(t),
               {n: 14.0 for n in names}, area)
    for kind, symbol, pick in (("heads", "circle", lambda n: node_kind(n) == "head"),
                               ("MLPs", "square", lambda n: node_kind(n) == "mlp"),
                               ("embeddings / logits", "diamond", lambda n: n in ("embed", "logits"))):
        ns = [n for n in names if pick(n)]
        if ns:
            fig.add_trace(go.Scatter(x=[pos[n][0] for n in ns], y=[pos[n][1] for n in ns], mode="markers+text",
                                     text=ns, textposition="bottom center" if kind == "MLPs" else "top center",
                                     textfont=dict(size=9 if kind == "MLPs" else 11), name=kind,
                                     marker=dict(symbol=symbol, size=14, color="#ffffff",
                                                 line=dict(color="#333333", width=1.5))))
    for inp, colour in INPUT_COLOURS.items():
        if inp in set(t["input"]):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=dict(color=colour, width=3),
                                     name=f"into {inp}"))
    fig.update_layout(title=title or f"The {counted(len(t), 'strongest edge')} of the whole graph (solid: measured "
                                     "exactly)",
                      xaxis=layer_axis(pos, area, "layer (embeddings left, logits right; MLPs between layers)"),
                      yaxis=dict(visible=False, range=list(area.y)), template="plotly_white", height=area.height)
    return fig


def _styles(t: Any) -> list[dict[str, Any]]:
    """Each edge's line: coloured by its input, as wide as its value, dotted where only screened, faint where it
    lowers the drop, its numbers in the hover text."""
    biggest = max(float(t["value"].abs().max()), 1e-12) if len(t) else 1.0
    out = []
    for row in t.itertuples():
        verified = not math.isnan(row.effect)
        where = "" if row.receiver == "logits" else f".{row.input}@{row.positions}"
        exact = f"{row.effect:+.3f} [{row.low:+.3f}, {row.high:+.3f}]" if verified else "not verified"
        out.append(dict(opacity=1.0 if row.value > 0 else 0.35,
                        line=dict(color=INPUT_COLOURS.get(row.input, "#7f7f7f"), width=1 + 7 * abs(row.value) / biggest,
                                  dash="solid" if verified else "dot"),
                        hovertemplate=f"{row.sender} -> {row.receiver}{where}<br>screen {row.score:+.3f}<br>exact "
                                      f"{exact}<extra></extra>"))
    return out
