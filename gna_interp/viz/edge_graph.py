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
from gna_interp.models.heads import HeadRef
from gna_interp.viz.graph import INPUT_COLOURS

__all__ = ["edge_graph"]

_COLOURS = {**INPUT_COLOURS, "mlp": "#e377c2"}


def _node_x(name: str, n_layers: int) -> float:
    if name == "embed":
        return -1.0
    if name == "logits":
        return float(n_layers)
    if name.startswith("MLP"):
        return int(name[3:]) + 0.5
    return float(HeadRef.parse(name).layer)


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
    layers = [int(_node_x(n, 0)) for n in names if n not in ("embed", "logits")]
    n_layers = max(layers, default=0) + 1
    by_x: dict[float, list[str]] = {}
    for n in names:
        if not n.startswith("MLP") and n not in ("embed", "logits"):
            by_x.setdefault(_node_x(n, n_layers), []).append(n)
    pos = {n: (x, i - (len(ns) - 1) / 2) for x, ns in by_x.items() for i, n in enumerate(sorted(ns))}
    low = min((y for _, y in pos.values()), default=0.0) - 1.5  # the MLPs in a row of their own, below the heads
    pos.update({n: (_node_x(n, n_layers), low) for n in names if n.startswith("MLP")})
    pos.update({n: (_node_x(n, n_layers), 0.0) for n in names if n in ("embed", "logits")})
    biggest = max(float(t["value"].abs().max()), 1e-12) if len(t) else 1.0
    fig = go.Figure()
    for row in t.itertuples():
        (x0, y0), (x1, y1) = pos[row.sender], pos[row.receiver]
        verified = not math.isnan(row.effect)
        colour = _COLOURS.get(row.input, "#7f7f7f")
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
    for inp, colour in _COLOURS.items():
        if inp in set(t["input"]):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=dict(color=colour, width=3),
                                     name=f"into {inp}"))
    fig.update_layout(title=title or f"The {len(t)} strongest edges of the whole graph (solid: measured exactly)",
                      xaxis=dict(title="layer (embeddings left, logits right; MLPs between layers)", zeroline=False),
                      yaxis=dict(visible=False), template="plotly_white", height=520)
    return fig
