"""`edge_graph(screen)`: the whole graph's strongest edges (:class:`~gna_interp.circuits.edge_screen.EdgeScreen`) --
the embeddings, heads, MLPs and the logits as nodes placed by layer, the edges as lines.

Heads are circles placed by layer, MLPs squares in a row of their own below them (between their layer and the next),
the embeddings and the logits diamonds at the two ends. An edge's width is its
exact effect where path patching measured it (solid) and its screened estimate otherwise (dotted); its colour is the
input it reaches (``q``, ``k``, ``v``, ``other``, an MLP's input, the logits), and its position class shows in the
hover text with both numbers. Edges that lower the metric's drop (negative effects) are drawn faint.
"""

from __future__ import annotations

import math
from typing import Any

from gna_interp.errors import InputError
from gna_interp.viz.graph import INPUT_COLOURS, node_positions

__all__ = ["edge_graph"]


def edge_graph(screen: Any, top: int = 40, title: str | None = None) -> Any:
    """Plotly figure of the ``top`` edges of ``screen``'s table by ``|effect|`` (exact where measured, else the
    screened score) and the nodes they join."""
    import plotly.graph_objects as go

    table = getattr(screen, "table", None)
    if table is None:
        raise InputError(f"edge_graph takes an EdgeScreen (gna_interp.circuits.edge_screen), got {type(screen).__name__}")
    t = table.copy()
    t["value"] = t["effect"].where(t["effect"].notna(), t["score"])
    t = t.reindex(t["value"].abs().sort_values(ascending=False).index).head(top)
    names = sorted(set(t["sender"]) | set(t["receiver"]))
    pos = node_positions(names)
    biggest = max(float(t["value"].abs().max()), 1e-12) if len(t) else 1.0
    fig = go.Figure()
    for row in t.itertuples():
        (x0, y0), (x1, y1) = pos[row.sender], pos[row.receiver]
        verified = not math.isnan(row.effect)
        colour = INPUT_COLOURS.get(row.input, "#7f7f7f")
        where = "" if row.receiver == "logits" else f".{row.input}@{row.positions}"
        exact = f"{row.effect:+.3f} [{row.low:+.3f}, {row.high:+.3f}]" if verified else "not verified"
        fig.add_trace(go.Scatter(
            x=[x0, (x0 + x1) / 2, x1], y=[y0, (y0 + y1) / 2, y1], mode="lines", showlegend=False,
            opacity=1.0 if row.value > 0 else 0.35,
            line=dict(color=colour, width=1 + 7 * abs(row.value) / biggest, dash="solid" if verified else "dot"),
            hovertemplate=f"{row.sender} -> {row.receiver}{where}<br>screen {row.score:+.3f}<br>exact {exact}"
                          "<extra></extra>"))
    for kind, symbol, pick in (("heads", "circle", lambda n: n not in ("embed", "logits") and not n.startswith("MLP")),
                               ("MLPs", "square", lambda n: n.startswith("MLP")),
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
    fig.update_layout(title=title or f"The {len(t)} strongest edges of the whole graph (solid: measured exactly)",
                      xaxis=dict(title="layer (embeddings left, logits right; MLPs between layers)", zeroline=False),
                      yaxis=dict(visible=False), template="plotly_white", height=520)
    return fig
