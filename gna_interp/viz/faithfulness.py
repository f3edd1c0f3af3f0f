"""`faithfulness_curve(fx)`: the fraction of the intact logit difference a circuit keeps as it grows, beside random
circuits of the same sizes (:class:`~gna_interp.circuits.search.sufficiency.Faithfulness`)."""

from __future__ import annotations

from typing import Any

from gna_interp.errors import InputError
from gna_interp.viz.text import counted


def faithfulness_curve(fx: Any, title: str | None = None) -> Any:
    """Plotly line chart over circuit size (a log axis beyond 40 heads): the ranked circuits' fraction with its 95 % band, the random
    circuits' median with their min-max band, the threshold, and the smallest circuit marked."""
    import plotly.graph_objects as go

    frame = getattr(fx, "to_frame", None)
    if frame is None:
        raise InputError(f"faithfulness_curve takes a Faithfulness result, got {type(fx).__name__}")
    df = frame()
    unit = getattr(fx, "unit", "heads")
    one = unit[:-1]
    fig = go.Figure()
    ranked = df[df.series == "ranked"].sort_values("size")
    log = fx.n_heads > 40  # many members: a log axis, size 0 drawn at 0.5
    floor = 0.5 if log else 0
    x = ranked["size"].clip(lower=floor)
    fig.add_trace(go.Scatter(x=list(x) + list(x)[::-1], y=list(ranked.high) + list(ranked.low)[::-1],
                             fill="toself", mode="lines", line=dict(width=0), fillcolor="rgba(31,119,180,0.18)",
                             name="ranked: 95 % interval", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=ranked.fraction, mode="lines+markers", name="ranked (scan order)",
                             line=dict(color="rgb(31,119,180)"), text=ranked[unit],
                             hovertemplate=f"{unit} in the circuit: %{{x}}<br>kept %{{y:.3f}}<extra></extra>"))
    rand = df[df.series == "random"]
    if len(rand):
        g = rand.groupby("size").fraction
        med, lo, hi = g.median(), g.min(), g.max()
        rx = med.index.to_series().clip(lower=floor)
        fig.add_trace(go.Scatter(x=list(rx) + list(rx)[::-1], y=list(hi) + list(lo)[::-1], fill="toself",
                                 mode="lines", line=dict(width=0), fillcolor="rgba(127,127,127,0.2)", name="random: min-max",
                                 hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=rx, y=med, mode="lines+markers", name="random (median)",
                                 line=dict(color="rgb(127,127,127)", dash="dash")))
    fig.add_hline(y=fx.threshold, line=dict(color="rgb(214,39,40)", dash="dot"),
                  annotation_text=f"threshold {fx.threshold:.0%}")
    if fx.smallest is not None:
        small = df[df.series == "smallest"].iloc[0]
        fig.add_trace(go.Scatter(x=[max(small["size"], floor)], y=[small.fraction], mode="markers",
                                 marker=dict(size=12, symbol="star", color="rgb(214,39,40)"),
                                 name=f"smallest: {counted(int(small['size']), one, unit)}"))
    fig.update_layout(title=title or f"Faithfulness: every {one} outside the circuit {fx.method}-ablated",
                      xaxis=dict(title=f"{unit} in the circuit" + (" (log scale; 0 drawn at 0.5)" if log else ""),
                                 type="log" if log else "linear"),
                      yaxis=dict(title="fraction of the intact logit difference kept"), template="plotly_white",
                      height=420)
    return fig
