"""`delegation_figure(result)`: what removing each head kind's aggregate heads costs, on retrieval and knowledge."""

from __future__ import annotations

import html
import math
import statistics
from typing import Any

from gna_interp.errors import InputError

_COLOURS = {"intact": "#7f8c8d", "aggregate": "#c0392b", "random": "#2471a3"}
_NAMES = {"intact": "intact", "aggregate": "aggregate heads removed", "random": "as many random heads removed"}


def delegation_figure(result: Any, title: str | None = None) -> Any:
    """Plotly bars from a :class:`~gna_interp.circuits.scan.delegation.Delegation`: per head kind with aggregate
    heads, retrieval accuracy intact, with the kind's aggregate heads removed together, and with as many
    random heads of the kind removed (median over the draws, whiskers min-max); a second panel shows the
    knowledge task's metric for the same removals when one was measured. Chance is drawn dashed."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    kinds = getattr(result, "kinds", None)
    removal = getattr(result, "removal", None)
    if kinds is None or removal is None:
        raise InputError(f"delegation_figure needs a Delegation result, got {type(result).__name__}")
    shown = kinds[kinds["aggregate_heads"] > 0]
    know = result.knowledge
    panels = [("accuracy", "retrieval accuracy")]
    if know:
        unit = "LM loss, nats/token (lower is better)" if know["metric"] == "lm_loss" else know["metric"]
        panels.append(("knowledge", f"knowledge: {know['name']} ({unit})"))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[1] for p in panels], horizontal_spacing=0.12)
    intact = removal[removal["series"] == "intact"].iloc[0]
    for col, (metric, _) in enumerate(panels, start=1):
        for series in ("intact", "aggregate", "random"):
            xs, ys, lo, hi, text = [], [], [], [], []
            for _, k in shown.iterrows():
                if series == "intact":
                    vals, heads = [float(intact[metric])], "none"
                else:
                    part = removal[(removal["kind"] == k["kind"]) & (removal["series"] == series)]
                    vals = [float(v) for v in part[metric]]
                    heads = "<br>".join(html.escape(str(h), quote=False) for h in part["heads"])
                if not vals:
                    continue
                med = statistics.median(vals)
                xs.append(f"{html.escape(str(k['title']), quote=False)} ({int(k['aggregate_heads'])} aggregate)")
                ys.append(med)
                lo.append(med - min(vals))
                hi.append(max(vals) - med)
                text.append(f"{html.escape(str(k['title']))}: {_NAMES[series]}<br>{metric} {med:.3f}"
                            + (f" (median of {len(vals)}: {min(vals):.3f}-{max(vals):.3f})" if len(vals) > 1 else "")
                            + f"<br>heads: {heads}")
            if not xs or all(isinstance(y, float) and math.isnan(y) for y in ys):
                continue
            fig.add_trace(go.Bar(x=xs, y=ys, name=_NAMES[series], marker_color=_COLOURS[series], legendgroup=series,
                                 showlegend=col == 1, hovertext=text, hoverinfo="text",
                                 error_y=dict(type="data", symmetric=False, array=hi, arrayminus=lo, visible=series == "random")),
                          row=1, col=col)
    fig.add_hline(y=float(result.chance), line=dict(color="#888", dash="dash"), row=1, col=1,
                  annotation_text=f"chance {result.chance:.2f}", annotation_position="bottom right")
    fig.update_yaxes(range=[0, 1.05], row=1, col=1)
    fig.update_layout(barmode="group", template="plotly_white", height=430,
                      title=dict(text=html.escape(title or f"Delegation in {result.model}: removing each kind's "
                                                           f"aggregate heads")),
                      legend=dict(orientation="h", y=-0.2), margin=dict(t=80))
    return fig
