"""`circuit_graph(circuit)`: the circuit as a graph you can click -- heads as nodes, measured paths as edges.

Nodes are the heads of the circuit's edge table (:attr:`Circuit.edges <gna_interp.circuits.search.circuit.Circuit.edges>`)
placed by layer, sized by their drop and coloured by their causal role; a ``logits`` node stands right of the last
layer. Each measured path with a positive effect is a line whose width is its effect (dashed where its 95 %
interval reaches 0), coloured by the input it reaches (``k``, ``v``, ``q`` or the logits directly), with a
marker on it that carries the numbers. Edges between the same two heads are bent apart, an edge bends around a
node it would cross, and each marker sits near its edge's middle, clear of the nodes, their labels and the other
markers (:mod:`gna_interp.viz.layout`); the x axis is ticked at the layers.

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
from typing import Any, Collection

import pandas as pd
from markupsafe import Markup

from gna_interp.errors import InputError
from gna_interp.models.graph import node_kind
from gna_interp.models.heads import HeadRef
from gna_interp.viz.head_view import head_explorer
from gna_interp.viz.html import HTMLView, asset, figure_div, part, render
from gna_interp.viz.layout import Frame, Point, bends, clear_bend, curve, layer_axis, marker_spots

__all__ = ["GRAPH_ID", "POSITION_DASHES", "circuit_graph", "draw_edges", "graph_figure", "graph_section",
           "node_positions", "whole_figure"]

GRAPH_ID = "gna-graph"
MAX_DRAWN_EDGES = 300  # a whole circuit's strongest edges drawn in its graph (every edge stays in circuit.json)
_EDGE_BOX = "gna-edge-detail"
ROLE_COLOURS = {"aggregate": "#d62728", "gather": "#1f77b4", "output": "#ff7f0e", "query": "#9467bd", "relay": "#bcbd22",
                "none": "#7f7f7f", "logits": "#2ca02c"}
INPUT_COLOURS = {"k": "#1f77b4", "v": "#17becf", "q": "#9467bd", "other": "#8c564b", "mlp": "#e377c2",
                 "logits": "#2ca02c"}
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


def _sizes(drops: list[float]) -> list[float]:
    """Head circles' diameters in px from their drops: 16 to 46 by the square root of the drop over the largest (a
    drop not measured, or below 0, at the least size)."""
    shown = [max(d, 0.0) if math.isfinite(d) else 0.0 for d in drops]
    big = max(shown + [1e-9])
    return [16 + 30 * math.sqrt(d / big) for d in shown]


def draw_edges(fig: Any, links: list[tuple[str, str, str]], pos: dict[str, Point], styles: list[dict[str, Any]],
               sizes: dict[str, float], area: Frame) -> list[tuple[Point, Point, float]]:
    """One line trace per ``(sender, receiver, input)`` link, with ``styles[i]`` its trace settings: links between
    the same two nodes bent apart (:func:`~gna_interp.viz.layout.bends`), a link that would run through another of
    the nodes (``sizes``: their diameters in px) bent around it. Returns each link's ``(start, end, bend)``."""
    import plotly.graph_objects as go

    nodes = [(pos[n], size) for n, size in sizes.items()]
    drawn = [(pos[s], pos[r], clear_bend(pos[s], pos[r], b, nodes, area))
             for (s, r, _), b in zip(links, bends(links, list(INPUT_COLOURS)))]
    for (a, b, bend), style in zip(drawn, styles):
        xs, ys = curve(a, b, bend)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", showlegend=False, **style))
    return drawn


def _edge_markers(fig: Any, drawn: list[tuple[Point, Point, float]], sizes: dict[str, float], pos: dict[str, Point],
                  area: Frame, marks: dict[str, Any], below: Collection[str] = ()) -> None:
    """The trace ``edges``: a diamond on each drawn edge, clear of the nodes, of their labels (above them, or
    ``below`` them for those named) and of each other; ``marks`` holds the markers' ``customdata``, ``hovertext``
    and ``symbol``."""
    import plotly.graph_objects as go

    labels = [(area.lifted(pos[n], (-1 if n in below else 1) * (size / 2 + 8)), 22.0) for n, size in sizes.items()]
    spots = marker_spots(drawn, [(pos[n], size) for n, size in sizes.items()] + labels, area)
    fig.add_trace(go.Scatter(x=[p[0] for p in spots], y=[p[1] for p in spots], mode="markers", name="edges",
                             customdata=marks["customdata"], hovertext=marks["hovertext"], hoverinfo="text",
                             showlegend=False, marker={"size": 11, "color": "#333", "symbol": marks["symbol"]}))


def _legend(fig: Any, entries: list[tuple[str, dict[str, Any]]]) -> None:
    """Legend-only traces: ``(name, settings)`` each."""
    import plotly.graph_objects as go

    for name, kw in entries:
        fig.add_trace(go.Scatter(x=[None], y=[None], name=name, **kw))


def _colour_keys(roles: set[str], inputs: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """Legend entries of the causal roles (node colours) and the inputs (edge colours) a graph shows."""
    return ([(f"{role} (causal)", {"mode": "markers", "marker": {"size": 12, "color": colour}})
             for role, colour in ROLE_COLOURS.items() if role in roles]
            + [(f"-> {inp}", {"mode": "lines", "line": {"width": 4, "color": colour}})
               for inp, colour in INPUT_COLOURS.items() if inp in inputs])


def _finish(fig: Any, pos: dict[str, Point], area: Frame, title: str, axis: str) -> Any:
    """The graph's layout: ``title``, the layer axis titled ``axis``, the rows' range and the height they need."""
    fig.update_layout(title=title, height=area.height, plot_bgcolor="white", hovermode="closest",
                      xaxis=layer_axis(pos, area, axis), yaxis={"visible": False, "range": list(area.y)})
    return fig


def graph_figure(frame: pd.DataFrame, edges: pd.DataFrame, title: str | None = None) -> Any:
    """The plotly figure of the graph: ``frame`` is the circuit frame (``name``, ``layer``, ``drop``, ``causal_role``),
    ``edges`` the edge table (:data:`~gna_interp.circuits.edges.causal.EDGE_COLUMNS`). The edge markers' trace is named
    ``edges`` and carries each edge's row index in ``customdata``; the node trace is named ``heads``."""
    import plotly.graph_objects as go

    rows = frame.set_index("name")
    names = list(dict.fromkeys(list(edges["sender"]) + [r for r in edges["receiver"] if r != "logits"]))
    pos = _positions(names, {n: int(rows.loc[n, "layer"]) for n in names})
    pos["logits"] = (max((p[0] for p in pos.values()), default=0.0) + 1.0, 0.0)
    raw = [float(rows.loc[n, "drop"]) for n in names]
    roles = [str(rows.loc[n, "causal_role"]) if "causal_role" in rows and isinstance(rows.loc[n, "causal_role"], str)
             else "none" for n in names]
    sizes = dict(zip(names + ["logits"], _sizes(raw) + [22.0]))
    area = Frame.around(pos, 420)
    fig = go.Figure()
    _path_edges(fig, edges, pos, sizes, area)
    fig.add_trace(go.Scatter(
        x=[pos[n][0] for n in names + ["logits"]], y=[pos[n][1] for n in names + ["logits"]],
        mode="markers+text", name="heads", text=names + ["logits"], textposition="top center",
        customdata=names + [""], hoverinfo="text",
        hovertext=[(f"{n}: drop {d:.3f}" if math.isfinite(d) else f"{n}: drop not measured")
                   + f", causal role {r}; click for its pattern" for n, d, r in zip(names, raw, roles)]
        + ["the answer logits"],
        marker={"size": list(sizes.values()), "line": {"width": 1, "color": "#222"},
                "color": [ROLE_COLOURS.get(r, "#7f7f7f") for r in roles] + [ROLE_COLOURS["logits"]]}, showlegend=False))
    _legend(fig, _colour_keys(set(roles), set(edges["input"])))
    return _finish(fig, pos, area, title or "Circuit graph: measured paths (width = effect on the logit difference)",
                   "layer")


def _path_edges(fig: Any, edges: pd.DataFrame, pos: dict[str, Point], sizes: dict[str, float], area: Frame) -> None:
    """The edge table's lines (those with a positive measured effect; dotted where the interval reaches 0) and
    their markers (``customdata``: the edge's row index)."""
    shown = [(int(i), e) for i, e in edges.iterrows()
             if float(e["effect"]) > 0 and math.isfinite(float(e["effect"]))]  # not measured, or nothing flows: no line
    top = max([float(e["effect"]) for _, e in shown] or [1.0])
    styles, marks = [], {"customdata": [], "hovertext": [], "symbol": "diamond"}
    for i, e in shown:
        eff, holds = float(e["effect"]), float(e["low"]) > 0
        styles.append({"hoverinfo": "skip", "line": {"width": 1 + 9 * eff / top, "dash": "solid" if holds else "dot",
                                                     "color": INPUT_COLOURS.get(e["input"], "#444")}})
        marks["customdata"].append(i)
        marks["hovertext"].append(f"{e['edge']}<br>effect {eff:+.3f} [{float(e['low']):+.3f}, {float(e['high']):+.3f}]"
                                  f"<br>{'holds' if holds else 'interval reaches 0'}; click for both patterns")
    drawn = draw_edges(fig, [(e["sender"], e["receiver"], e["input"]) for _, e in shown], pos, styles, sizes, area)
    _edge_markers(fig, drawn, sizes, pos, area, marks)


def _kind(name: str) -> str:
    """A whole-graph node's kind from its name (:func:`~gna_interp.models.graph.node_kind`)."""
    return node_kind(name)


def node_positions(names: list[str]) -> dict[str, tuple[float, float]]:
    """``(x, y)`` per node of the whole graph (names as :mod:`gna_interp.circuits.edges.whole_circuit` gives them): heads
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
    """The plotly figure of a whole circuit (:class:`~gna_interp.circuits.edges.whole_circuit.WholeCircuit`): nodes by
    :func:`node_positions` (heads circles sized by ``drops`` and coloured by their causal role, MLPs squares, the
    embeddings and logits at the ends), each edge a line coloured by the input it reaches, dashed by its position
    class (:data:`POSITION_DASHES`), its width the exact effect (the screen score where none was measured), faint
    when its interval reaches 0 or it was only screened; edges between the same two nodes bent apart. Traces:
    ``edges`` (the markers, ``customdata`` the edge's index in ``whole.edges``), ``heads`` and ``nodes`` (MLPs,
    embeddings, logits; ``customdata`` their names)."""
    import plotly.graph_objects as go

    drops = drops or {}
    pos = node_positions([n.name for n in whole.nodes])
    heads, others = [n for n in whole.nodes if n.kind == "head"], [n for n in whole.nodes if n.kind != "head"]
    raw = [float(drops.get(n.name, math.nan)) for n in heads]
    sizes = dict(zip([n.name for n in heads], _sizes(raw))) | {n.name: 20.0 for n in others}
    area = Frame.around(pos, 520)
    fig = go.Figure()
    drawn = _whole_edges(fig, whole, pos, sizes, area)
    roles = [n.role or "none" for n in heads]
    fig.add_trace(go.Scatter(
        x=[pos[n.name][0] for n in heads], y=[pos[n.name][1] for n in heads], mode="markers+text", name="heads",
        text=[n.name for n in heads], textposition="top center", customdata=[n.name for n in heads], hoverinfo="text",
        hovertext=[(f"{n.name}: drop {d:.3f}" if math.isfinite(d) else f"{n.name}: drop not measured")
                   + f", causal role {r}; click for its pattern" for n, d, r in zip(heads, raw, roles)],
        marker={"size": [sizes[n.name] for n in heads], "color": [ROLE_COLOURS.get(r, "#7f7f7f") for r in roles],
                "line": {"width": 1, "color": "#222"}}, showlegend=False))
    fig.add_trace(go.Scatter(
        x=[pos[n.name][0] for n in others], y=[pos[n.name][1] for n in others], mode="markers+text", name="nodes",
        text=[n.name for n in others], textposition="bottom center", customdata=[n.name for n in others],
        hoverinfo="text", hovertext=[f"{n.name} ({_NODE_SYMBOLS[n.kind][2]}): click for its edges" for n in others],
        marker={"size": 20, "symbol": [_NODE_SYMBOLS[n.kind][0] for n in others],
                "color": [_NODE_SYMBOLS[n.kind][1] for n in others], "line": {"width": 1, "color": "#222"}},
        showlegend=False))
    _whole_legend(fig, whole, set(roles))
    if title is None and drawn < len(whole.edges):
        title = (f"The whole circuit: its {drawn:,} strongest edges of {len(whole.edges):,} (width = effect on the "
                 f"logit difference; faint: screened only, or its interval reaches 0)")
    return _finish(fig, pos, area, title or "The whole circuit (width = effect on the logit difference; faint: "
                                            "screened only, or its interval reaches 0)",
                   "layer (MLPs half a layer after their block's heads)")


def _whole_edges(fig: Any, whole: Any, pos: dict[str, Point], sizes: dict[str, float], area: Frame) -> int:
    """The whole circuit's edge lines and their markers (open where the edge was only screened): the
    :data:`MAX_DRAWN_EDGES` strongest by ``|weight|`` where there are more (placing each line and marker clear of the
    others grows with the square of their number, and thousands of lines draw nothing readable); returns how many.
    A marker's ``customdata`` is its edge's index in ``whole.edges``."""
    keep = sorted(sorted(range(len(whole.edges)), key=lambda i: -abs(whole.edges[i].weight))[:MAX_DRAWN_EDGES])
    edges = [whole.edges[i] for i in keep]
    top = max([abs(e.weight) for e in edges] + [1e-9])
    styles = [{"hoverinfo": "skip", "opacity": 1.0 if e.measured and e.low is not None and e.low > 0 else 0.5,
               "line": {"width": 1 + 9 * max(e.weight, 0.0) / top, "color": INPUT_COLOURS.get(e.input, "#444"),
                        "dash": POSITION_DASHES[e.positions][0]}} for e in edges]
    drawn = draw_edges(fig, [(e.sender, e.receiver, e.input) for e in edges], pos, styles, sizes, area)
    marks = {"customdata": keep, "hovertext": [_edge_hover(e) for e in edges],
             "symbol": ["diamond" if e.measured else "diamond-open" for e in edges]}
    _edge_markers(fig, drawn, sizes, pos, area, marks, below={n.name for n in whole.nodes if n.kind != "head"})
    return len(edges)


def _whole_legend(fig: Any, whole: Any, roles: set[str]) -> None:
    """Legend entries of :func:`whole_figure`: causal roles, node kinds, inputs (colours), positions (dashes)."""
    kinds = sorted({n.kind for n in whole.nodes} - {"head"})
    inputs, places = {e.input for e in whole.edges}, {e.positions for e in whole.edges}
    _legend(fig, _colour_keys(roles, inputs)
            + [(_NODE_SYMBOLS[k][2], {"mode": "markers", "marker": {"size": 12, "color": _NODE_SYMBOLS[k][1],
                                                                    "symbol": _NODE_SYMBOLS[k][0]}}) for k in kinds]
            + [(label, {"mode": "lines", "line": {"width": 3, "color": "#444", "dash": dash}})
               for where, (dash, label) in POSITION_DASHES.items() if where in places])


def _rows(seg: Any) -> dict[str, list[int]]:
    """The card sample's pattern rows of each position set of :mod:`gna_interp.circuits.edges.paths`."""
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
    ``circuit``: a :class:`~gna_interp.circuits.search.circuit.Circuit`, or a `gna scan` folder (or its circuit.json) to
    read one from."""
    from gna_interp.circuits.search.circuit import Circuit

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
