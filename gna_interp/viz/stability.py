"""`stability_plot(stability)`: how far a scan's ranking holds up on disjoint halves of its samples."""

from __future__ import annotations

import html
from typing import Any

from gna_interp.errors import InputError


def stability_plot(stability: dict[str, Any], title: str | None = None) -> Any:
    """Plotly scatter of each exactly run head's drop measured on one half of the samples (x) against the
    other half (y), as :meth:`HeadScan.stability <gna_interp.circuits.scan.HeadScan.stability>` gives
    them; heads in both halves' top k are filled, in one only hollow, and the title states the overlaps."""
    import plotly.graph_objects as go

    if not stability or "drops_a" not in stability:
        raise InputError("no stability numbers: the scan needs at least two exactly run heads and two samples")
    a, b = stability["drops_a"], stability["drops_b"]
    top_a, top_b = set(stability["top_half_a"]), set(stability["top_half_b"])
    names = sorted(a, key=lambda n: -(a[n] + b[n]))
    both = [n for n in names if n in top_a and n in top_b]
    one = [n for n in names if (n in top_a) != (n in top_b)]
    rest = [n for n in names if n not in top_a and n not in top_b]
    fig = go.Figure()
    for group, label, marker in ((rest, "in neither top", dict(color="#bbb", size=7)),
                                 (one, "in one half's top", dict(color="#2e86c1", size=10, symbol="circle-open")),
                                 (both, "in both halves' top", dict(color="#c0392b", size=11))):
        if group:
            fig.add_trace(go.Scatter(x=[a[n] for n in group], y=[b[n] for n in group], mode="markers+text"
                                     if group is not rest else "markers", text=group if group is not rest else None,
                                     textposition="top center", marker=marker, name=label,
                                     hovertemplate="%{hovertext}<br>half A %{x:.3f}<br>half B %{y:.3f}<extra></extra>",
                                     hovertext=[html.escape(n) for n in group]))
    lo = min(min(a.values()), min(b.values()))
    hi = max(max(a.values()), max(b.values()))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#999", dash="dash"),
                             showlegend=False, hoverinfo="skip"))
    k = stability["k"]
    fig.update_layout(title=dict(text=title or f"Rank stability: top-{k} overlap {stability['top_k_overlap']}/{k}, "
                                 f"top-5 overlap {stability['top5_overlap']}/{min(5, k)} ({stability['halves']})"),
                      xaxis=dict(title=dict(text="drop on half A (even samples)")),
                      yaxis=dict(title=dict(text="drop on half B (odd samples)")), height=460, template="plotly_white",
                      legend=dict(orientation="h", yanchor="bottom", y=-0.3, x=0))
    return fig
