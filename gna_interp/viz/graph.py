"""`circuit_graph(circuit)`: the circuit as a graph you can click -- heads as nodes, measured paths as edges.

Nodes are the heads of the circuit's edge table (:attr:`Circuit.edges <gna_interp.circuits.circuit.Circuit.edges>`)
placed by layer, sized by their drop and coloured by their causal role; a ``logits`` node stands right of the last
layer. Each measured path with a positive effect is a line whose width is its effect (dashed where its 95 %
interval reaches 0), coloured by the input it reaches (``k``, ``v``, ``q`` or the logits directly), with a
marker at its middle that carries the numbers.

In the report and in the :class:`~gna_interp.viz.html.HTMLView` this module returns, clicking a node shows what a
heatmap click shows (the head's pattern on the card sample and its numbers, :mod:`gna_interp.viz.head_view`);
clicking an edge's marker draws the sender's pattern at the positions the edge removes it from (the lines' tokens of
a key/value edge, the decision position of a query edge) on the card sample, next to the receiver's row at the
decision position, both decoded in the browser from the stored all-head patterns. Strings reach
the page as JSON data and are written with ``textContent`` only.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pandas as pd
from markupsafe import Markup

from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.viz.head_view import head_explorer
from gna_interp.viz.html import HTMLView, asset, figure_div, part, render

__all__ = ["GRAPH_ID", "POSITION_DASHES", "circuit_graph", "graph_figure", "graph_section", "node_positions",
           "whole_figure"]

GRAPH_ID = "gna-graph"
_EDGE_BOX = "gna-edge-detail"
ROLE_COLOURS = {"aggregate": "#d62728", "gather": "#1f77b4", "output": "#ff7f0e", "query": "#9467bd", "relay": "#bcbd22",
                "none": "#7f7f7f", "logits": "#2ca02c"}
INPUT_COLOURS = {"k": "#1f77b4", "v": "#17becf", "q": "#9467bd", "other": "#8c564b", "mlp": "#e377c2",
                 "logits": "#2ca02c"}
_OFFSET = {"k": -0.12, "v": 0.0, "q": 0.12, "other": 0.06, "mlp": 0.0, "logits": 0.0}
# the whole circuit's edges: the line's dash says where the edge acts (legend text beside each)
POSITION_DASHES = {"items": ("solid", "at the lines' tokens"), "summary": ("dashdot", "at the lines' last tokens"),
                   "decision": ("dash", "at the decision position"), "other": ("longdashdot", "at the other tokens"),
                   "all": ("dot", "at every position")}
_NODE_SYMBOLS = {"mlp": ("square", "#e377c2", "MLP"), "embed": ("triangle-right", "#bbbbbb", "embeddings"),
                 "logits": ("circle", ROLE_COLOURS["logits"], "logits")}


def _positions(names: list[str], layers: dict[str, int]) -> dict[str, tuple[float, float]]:
    """``(x, y)`` per head: x its layer, y its place among the heads of that layer (centred)."""
    by_layer: dict[int, list[str]] = {}
    for n in names:
        by_layer.setdefault(layers[n], []).append(n)
    out = {}
    for layer, ns in by_layer.items():
        for i, n in enumerate(ns):
            out[n] = (float(layer), i - (len(ns) - 1) / 2)
    return out


def graph_figure(frame: pd.DataFrame, edges: pd.DataFrame, title: str | None = None) -> Any:
    """The plotly figure of the graph: ``frame`` is the circuit frame (``name``, ``layer``, ``drop``, ``causal_role``),
    ``edges`` the edge table (:data:`~gna_interp.circuits.causal.EDGE_COLUMNS`). The edge markers' trace is named
    ``edges`` and carries each edge's row index in ``customdata``; the node trace is named ``heads``."""
    import plotly.graph_objects as go

    rows = frame.set_index("name")
    names = list(dict.fromkeys(list(edges["sender"]) + [r for r in edges["receiver"] if r != "logits"]))
    layers = {n: int(rows.loc[n, "layer"]) for n in names}
    pos = _positions(names, layers)
    pos["logits"] = (max(layers.values(), default=0) + 1.0, 0.0)
    fig = go.Figure()
    top = max([float(e) for e in edges["effect"] if float(e) > 0 and math.isfinite(float(e))] or [1.0])
    mx, my, md, mt = [], [], [], []
    for i, e in edges.iterrows():
        eff = float(e["effect"])
        if not (eff > 0 and math.isfinite(eff)):  # not measured, or nothing flows: no line
            continue
        (x0, y0), (x1, y1) = pos[e["sender"]], pos[e["receiver"]]
        off = _OFFSET.get(e["input"], 0.0)
        xs, ys = [x0, (x0 + x1) / 2, x1], [y0, (y0 + y1) / 2 + off, y1]
        holds = float(e["low"]) > 0
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 line={"width": 1 + 9 * eff / top, "color": INPUT_COLOURS.get(e["input"], "#444"),
                                       "dash": "solid" if holds else "dot", "shape": "spline"}))
        mx.append(xs[1])
        my.append(ys[1])
        md.append(int(i))
        mt.append(f"{e['edge']}<br>effect {eff:+.3f} [{float(e['low']):+.3f}, {float(e['high']):+.3f}]"
                  f"<br>{'holds' if holds else 'interval reaches 0'}; click for both patterns")
    fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", name="edges", customdata=md, hovertext=mt,
                             hoverinfo="text", marker={"size": 11, "color": "#333", "symbol": "diamond"},
                             showlegend=False))
    raw = [float(rows.loc[n, "drop"]) for n in names]
    drops = [max(d, 0.0) if math.isfinite(d) else 0.0 for d in raw]  # a drop not measured is drawn at the least size
    big = max(drops + [1e-9])
    roles = [str(rows.loc[n, "causal_role"]) if "causal_role" in rows and isinstance(rows.loc[n, "causal_role"], str)
             else "none" for n in names]
    fig.add_trace(go.Scatter(
        x=[pos[n][0] for n in names] + [pos["logits"][0]], y=[pos[n][1] for n in names] + [0.0],
        mode="markers+text", name="heads", text=names + ["logits"], textposition="top center",
        customdata=names + [""], hoverinfo="text",
        hovertext=[(f"{n}: drop {d:.3f}" if math.isfinite(d) else f"{n}: drop not measured")
                   + f", causal role {r}; click for its pattern" for n, d, r in zip(names, raw, roles)]
        + ["the answer logits"],
        marker={"size": [16 + 30 * math.sqrt(d / big) for d in drops] + [22],
                "color": [ROLE_COLOURS.get(r, "#7f7f7f") for r in roles] + [ROLE_COLOURS["logits"]],
                "line": {"width": 1, "color": "#222"}}, showlegend=False))
    for role, colour in ROLE_COLOURS.items():  # legend entries only
        if role in roles:
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{role} (causal)",
                                     marker={"size": 12, "color": colour}))
    for inp, colour in INPUT_COLOURS.items():
        if inp in set(edges["input"]):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"-> {inp}",
                                     line={"width": 4, "color": colour}))
    span = sorted({int(p[0]) for p in pos.values()})
    fig.update_layout(title=title or "Circuit graph: measured paths (width = effect on the logit difference)",
                      height=420, plot_bgcolor="white", hovermode="closest",
                      xaxis={"title": "layer", "tickvals": span,
                             "ticktext": [str(x) if x != span[-1] else "logits" for x in span], "zeroline": False},
                      yaxis={"visible": False, "range": [min(p[1] for p in pos.values()) - 0.8,
                                                         max(p[1] for p in pos.values()) + 0.8]})
    return fig


def _kind(name: str) -> str:
    """A whole-graph node's kind from its name (``embed``, ``logits``, ``MLP3``, else a head)."""
    return name if name in ("embed", "logits") else "mlp" if name.startswith("MLP") else "head"


def node_positions(names: list[str]) -> dict[str, tuple[float, float]]:
    """``(x, y)`` per node of the whole graph (names as :mod:`gna_interp.circuits.whole_circuit` gives them): heads
    at their layer (centred among that layer's heads), each MLP in a row of its own below the heads half a layer
    after its block's heads, the embeddings left of layer 0 and the logits right of the last layer, both at 0."""
    heads = [n for n in names if _kind(n) == "head"]
    mlps = [n for n in names if _kind(n) == "mlp"]
    layers = {n: HeadRef.parse(n).layer for n in heads} | {n: int(n[3:]) for n in mlps}
    pos = _positions(sorted(heads, key=lambda n: HeadRef.parse(n).head), layers)
    low = min((y for _, y in pos.values()), default=0.0) - 1.5
    pos.update({n: (layers[n] + 0.5, low) for n in mlps})
    pos.update({n: (-1.0 if n == "embed" else max(layers.values(), default=-1) + 1.0, 0.0)
                for n in names if n in ("embed", "logits")})
    return pos


def _edge_hover(e: Any) -> str:
    """The hover text of a whole-circuit edge's marker: its label, exact effect (or that it was screened only)."""
    exact = (f"effect {e.effect:+.3f}" + (f" [{e.low:+.3f}, {e.high:+.3f}]" if e.low is not None and e.high is not None
                                          else "")
             if e.measured else "not measured exactly")
    score = f"; screen score {e.score:+.3f}" if e.score is not None else ""
    return f"{e.name}<br>{exact}{score}<br>{POSITION_DASHES[e.positions][1]}; click for both patterns"


def whole_figure(whole: Any, drops: dict[str, float] | None = None, title: str | None = None) -> Any:
    """The plotly figure of a whole circuit (:class:`~gna_interp.circuits.whole_circuit.WholeCircuit`): nodes by
    :func:`node_positions` (heads circles sized by ``drops`` and coloured by their causal role, MLPs squares, the
    embeddings and logits at the ends), each edge a line coloured by the input it reaches, dashed by its position
    class (:data:`POSITION_DASHES`), its width the exact effect (the screen score where none was measured), faint
    when its interval reaches 0 or it was only screened. Traces: ``edges`` (the markers, ``customdata`` the edge's
    index in ``whole.edges``), ``heads`` and ``nodes`` (MLPs, embeddings, logits; ``customdata`` their names)."""
    import plotly.graph_objects as go

    drops = drops or {}
    pos = node_positions([n.name for n in whole.nodes])
    top = max([abs(e.weight) for e in whole.edges] + [1e-9])
    fig = go.Figure()
    marks: dict[str, list[Any]] = {"x": [], "y": [], "customdata": [], "hovertext": [], "symbol": []}
    for i, e in enumerate(whole.edges):
        (x0, y0), (x1, y1) = pos[e.sender], pos[e.receiver]
        xs, ys = [x0, (x0 + x1) / 2, x1], [y0, (y0 + y1) / 2 + _OFFSET.get(e.input, 0.0), y1]
        holds = e.measured and e.low is not None and e.low > 0
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 opacity=1.0 if holds else 0.5,
                                 line={"width": 1 + 9 * max(e.weight, 0.0) / top, "shape": "spline",
                                       "color": INPUT_COLOURS.get(e.input, "#444"),
                                       "dash": POSITION_DASHES[e.positions][0]}))
        for key, v in (("x", xs[1]), ("y", ys[1]), ("customdata", i), ("hovertext", _edge_hover(e)),
                       ("symbol", "diamond" if e.measured else "diamond-open")):
            marks[key].append(v)
    fig.add_trace(go.Scatter(x=marks["x"], y=marks["y"], mode="markers", name="edges", customdata=marks["customdata"],
                             hovertext=marks["hovertext"], hoverinfo="text", showlegend=False,
                             marker={"size": 11, "color": "#333", "symbol": marks["symbol"]}))
    heads = [n for n in whole.nodes if n.kind == "head"]
    raw = [float(drops.get(n.name, math.nan)) for n in heads]
    sizes = [max(d, 0.0) if math.isfinite(d) else 0.0 for d in raw]
    roles = [n.role or "none" for n in heads]
    fig.add_trace(go.Scatter(
        x=[pos[n.name][0] for n in heads], y=[pos[n.name][1] for n in heads], mode="markers+text", name="heads",
        text=[n.name for n in heads], textposition="top center", customdata=[n.name for n in heads], hoverinfo="text",
        hovertext=[(f"{n.name}: drop {d:.3f}" if math.isfinite(d) else f"{n.name}: drop not measured")
                   + f", causal role {r}; click for its pattern" for n, d, r in zip(heads, raw, roles)],
        marker={"size": [16 + 30 * math.sqrt(d / max(sizes + [1e-9])) for d in sizes],
                "color": [ROLE_COLOURS.get(r, "#7f7f7f") for r in roles], "line": {"width": 1, "color": "#222"}},
        showlegend=False))
    others = [n for n in whole.nodes if n.kind != "head"]
    fig.add_trace(go.Scatter(
        x=[pos[n.name][0] for n in others], y=[pos[n.name][1] for n in others], mode="markers+text", name="nodes",
        text=[n.name for n in others], textposition="bottom center", customdata=[n.name for n in others],
        hoverinfo="text", hovertext=[f"{n.name} ({_NODE_SYMBOLS[n.kind][2]}): click for its edges" for n in others],
        marker={"size": 20, "symbol": [_NODE_SYMBOLS[n.kind][0] for n in others],
                "color": [_NODE_SYMBOLS[n.kind][1] for n in others], "line": {"width": 1, "color": "#222"}},
        showlegend=False))
    _whole_legend(fig, whole, set(roles))
    ticks = {x: str(int(x)) if _kind(n) == "head" else n for n, (x, _) in pos.items() if _kind(n) != "mlp"}
    fig.update_layout(title=title or "The whole circuit (width = effect on the logit difference; faint: screened "
                                     "only, or its interval reaches 0)",
                      height=520, plot_bgcolor="white", hovermode="closest",
                      xaxis={"title": "layer (MLPs half a layer after their block's heads)", "tickvals": sorted(ticks),
                             "ticktext": [ticks[x] for x in sorted(ticks)], "zeroline": False},
                      yaxis={"visible": False, "range": [min(p[1] for p in pos.values()) - 0.8,
                                                         max(p[1] for p in pos.values()) + 0.8]})
    return fig


def _whole_legend(fig: Any, whole: Any, roles: set[str]) -> None:
    """Legend entries of :func:`whole_figure`: causal roles, node kinds, inputs (colours), positions (dashes)."""
    import plotly.graph_objects as go

    def entry(name: str, **kw: Any) -> None:
        fig.add_trace(go.Scatter(x=[None], y=[None], name=name, **kw))

    for role, colour in ROLE_COLOURS.items():
        if role in roles:
            entry(f"{role} (causal)", mode="markers", marker={"size": 12, "color": colour})
    for kind in sorted({n.kind for n in whole.nodes} - {"head"}):
        symbol, colour, label = _NODE_SYMBOLS[kind]
        entry(label, mode="markers", marker={"size": 12, "color": colour, "symbol": symbol})
    inputs, places = {e.input for e in whole.edges}, {e.positions for e in whole.edges}
    for inp, colour in INPUT_COLOURS.items():
        if inp in inputs:
            entry(f"-> {inp}", mode="lines", line={"width": 4, "color": colour})
    for where, (dash, label) in POSITION_DASHES.items():
        if where in places:
            entry(label, mode="lines", line={"width": 3, "color": "#444", "dash": dash})


def _rows(seg: Any) -> dict[str, list[int]]:
    """The card sample's pattern rows of each position set of :mod:`gna_interp.circuits.paths`."""
    if seg is None:
        return {}
    decision = list(range(int(seg.final), int(seg.n_tokens)))
    items = [p for sp in seg.items for p in range(sp.start, sp.stop)]
    rest = sorted(set(range(int(seg.n_tokens))) - set(items) - set(decision))
    return {"summary": list(seg.summaries), "items": items, "decision": decision, "other": rest,
            "all": list(range(int(seg.n_tokens)))}


def graph_section(circuit: Any, graph_id: str = GRAPH_ID) -> tuple[str, Any]:
    """The graph's HTML (figure, edge box, data, script) and its figure, for a page that also holds the head
    explorer (:func:`~gna_interp.viz.head_view.head_explorer`) and the plotly bundle: the whole circuit
    (:func:`whole_figure`) when the circuit has one, else the edge table among its top heads (:func:`graph_figure`);
    a note without a figure when it has neither."""
    whole, edges = circuit.whole, circuit.edges
    if whole is None and (edges is None or not len(edges)):
        return part("note", "No circuit graph: this circuit has no edge table (discover with paths >= 2 measures "
                            "one; rerun `gna scan`)."), None
    drops = circuit.edge_drops()  # in the edges' unit (an accuracy scan's own drop is NaN for a head not run)
    if whole is not None:
        fig = whole_figure(whole, drops)
        rows = [{"edge": e.name, **{k: (_number(v) if k in ("score", "effect", "low", "high") else str(v))
                                    for k, v in e.to_dict().items()}} for e in whole.edges]
        nodes: dict[str, Any] | None = {n.name: n.to_dict() for n in whole.nodes}
    else:
        frame = circuit.to_frame()
        fig = graph_figure(frame.assign(drop=frame["name"].map(drops)), edges)
        rows = [{k: (_number(v) if k in ("effect", "low", "high") else str(v)) for k, v in row.items()}
                for row in edges.to_dict("records")]
        nodes = None
    views = circuit.views
    every = views.all_heads if views is not None else None
    sample = every.sample if every is not None else 0
    seg = views.segments[sample] if views is not None else None
    data = {"graph": graph_id, "edges": rows, "nodes": nodes,
            "tokens": list(views.patterns.str_tokens[sample]) if views is not None else [],
            "rows": _rows(seg), "final": int(seg.final) if seg else 0}
    note = ("Click a head for its pattern and numbers (shown in the head box of this page), "
            + ("an MLP, the embeddings or the logits for their edges in and out, " if whole is not None else "")
            + "or an edge's diamond for the sender's pattern where the edge removes it (the lines' tokens for keys "
              "and values, the decision position for a query) next to the receiver's row at the decision position"
            + (f" (card sample {sample})." if views is not None else "; this circuit has no stored patterns."))
    return render("graph.html", figure=Markup(figure_div(fig, div_id=graph_id)), note=note, box_id=_EDGE_BOX,
                  data=data, script=asset("graph.js")), fig


def _number(v: Any) -> float | None:
    """A table value for the page's JSON data: a finite float, or None (JSON has no NaN; None: not measured)."""
    if v is None:
        return None
    x = float(v)
    return x if math.isfinite(x) else None


def circuit_graph(circuit: Any) -> HTMLView:
    """The circuit graph with its click views as a self-contained view: displays itself in Jupyter, ``.save(path)``
    writes an offline page. Node clicks show the head's pattern and numbers, edge clicks both patterns.
    ``circuit``: a :class:`~gna_interp.circuits.circuit.Circuit`, or a `gna scan` folder (or its circuit.json) to
    read one from."""
    from gna_interp.circuits.circuit import Circuit

    if isinstance(circuit, (str, os.PathLike)):
        circuit = Circuit.load(circuit)
    elif not isinstance(circuit, Circuit):
        raise InputError(f"circuit_graph takes a Circuit or the folder `gna scan --out DIR` wrote, got "
                         f"{type(circuit).__name__}")
    section, _ = graph_section(circuit)
    drawn = circuit.edges is not None or circuit.whole is not None
    explorer = head_explorer(circuit.to_frame(), circuit.views) if drawn else ""
    return HTMLView(section + explorer, title=f"Circuit graph: {circuit.model}", circuitsvis=True, plotly=True,
                    frame_height=1100)
