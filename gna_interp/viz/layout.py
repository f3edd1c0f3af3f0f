"""Where the graphs' pieces go (:mod:`gna_interp.viz.graph`, :mod:`gna_interp.viz.edge_graph`): edges between the
same two nodes bent apart, an edge that would cross a node bent around it, each edge's marker on its own curve clear
of the nodes and of the other markers, an axis ticked at the layers, a height that keeps one layer's nodes apart.

Distances are judged in pixels of a plot of :data:`PLOT_WIDTH` (narrower than a report's, so a wider page only adds
room) and of the figure's own height less its margins."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["PLOT_WIDTH", "Frame", "bends", "clear_bend", "curve", "layer_axis", "marker_spots"]

Point = tuple[float, float]
PLOT_WIDTH = 700  # px: the plot area the spacing is judged on
_MARGINS = 180  # px of the figure's height outside its plot area (title, axis, ticks)
_UNIT = 62  # px between two nodes of one layer: room for the largest head circle (46 px) and a gap
_PAD_X, _PAD_Y = 0.4, 0.8  # axis room beyond the outermost nodes, in layers and in rows
_BEND = 0.28  # rows between the middles of two edges that join the same nodes
_STEPS = 24  # straight pieces of a drawn curve
_SPOTS = (0.5, 0.42, 0.58, 0.34, 0.66, 0.26, 0.74, 0.18, 0.82)  # where along its curve a marker may sit, best first
_MARKER_GAP = 14  # px between two markers' centres
_NODE_GAP = 8  # px between a marker's centre and a node's edge


@dataclass(frozen=True)
class Frame:
    """A graph's axis ranges (``x`` in layers, ``y`` in rows) and its figure's height in px."""

    x: tuple[float, float]
    y: tuple[float, float]
    height: int

    @classmethod
    def around(cls, pos: dict[str, Point], height: int) -> "Frame":
        """The frame of nodes at ``pos``: room around them, and a height (at least ``height``) that keeps rows
        ``_UNIT`` pixels apart."""
        xs, ys = [p[0] for p in pos.values()] or [0.0], [p[1] for p in pos.values()] or [0.0]
        y = (min(ys) - _PAD_Y, max(ys) + _PAD_Y)
        return cls((min(xs) - _PAD_X, max(xs) + _PAD_X), y, max(height, int(_MARGINS + _UNIT * (y[1] - y[0]))))

    def lifted(self, p: Point, px: float) -> Point:
        """``p`` moved ``px`` pixels up (down where negative)."""
        return p[0], p[1] + px * (self.y[1] - self.y[0]) / (self.height - _MARGINS)

    def pixels(self, a: Point, b: Point) -> float:
        """The distance between ``a`` and ``b`` on the plot, in pixels."""
        sx = PLOT_WIDTH / (self.x[1] - self.x[0])
        sy = (self.height - _MARGINS) / (self.y[1] - self.y[0])
        return math.hypot((a[0] - b[0]) * sx, (a[1] - b[1]) * sy)


def bends(links: Sequence[tuple[str, str, str]], order: Sequence[str]) -> list[float]:
    """Each ``(sender, receiver, input)`` link's bend in rows: 0 for the only link between its two nodes, else the
    links between them spread ``_BEND`` apart around 0, in the order of their inputs in ``order``."""
    place = {i: n for n, i in enumerate(order)}
    groups: dict[tuple[str, str], list[int]] = {}
    for k, (s, r, _) in enumerate(links):
        groups.setdefault((s, r), []).append(k)
    out = [0.0] * len(links)
    for ks in groups.values():
        ks.sort(key=lambda k: (place.get(links[k][2], len(order)), k))
        for j, k in enumerate(ks):
            out[k] = (j - (len(ks) - 1) / 2) * _BEND
    return out


def _point(a: Point, b: Point, bend: float, t: float) -> Point:
    """The point at ``t`` (0 at ``a``, 1 at ``b``) of the quadratic curve whose middle lies ``bend`` rows above the
    middle of the straight line."""
    cx, cy = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 2 * bend
    u = 1 - t
    return u * u * a[0] + 2 * u * t * cx + t * t * b[0], u * u * a[1] + 2 * u * t * cy + t * t * b[1]


def curve(a: Point, b: Point, bend: float) -> tuple[list[float], list[float]]:
    """The ``x`` and ``y`` of an edge from ``a`` to ``b`` bent ``bend`` rows (a straight line at 0)."""
    pts = [_point(a, b, bend, k / _STEPS) for k in range(_STEPS + 1)] if bend else [a, b]
    return [p[0] for p in pts], [p[1] for p in pts]


def clear_bend(a: Point, b: Point, bend: float, nodes: Sequence[tuple[Point, float]], frame: Frame) -> float:
    """``bend``, or the nearest bend ``_BEND`` steps away whose curve from ``a`` to ``b`` passes clear of the
    ``(centre, diameter in px)`` nodes other than its ends (``bend`` itself where none does)."""
    others = [(c, size) for c, size in nodes if c not in (a, b)]

    def clear(k: float) -> bool:
        return all(frame.pixels(_point(a, b, k, t / _STEPS), c) >= size / 2 + 3
                   for t in range(1, _STEPS) for c, size in others)

    return next((bend + d * _BEND for d in (0, 1, -1, 2, -2, 3, -3) if clear(bend + d * _BEND)), bend)


def marker_spots(edges: Sequence[tuple[Point, Point, float]], nodes: Sequence[tuple[Point, float]],
                 frame: Frame) -> list[Point]:
    """Where each ``(a, b, bend)`` edge's marker sits: on its curve, at the spot nearest its middle that keeps clear
    of the ``(centre, diameter in px)`` nodes and of the markers placed before it (the clearest spot if none does)."""
    placed: list[Point] = []
    for a, b, bend in edges:
        def room(p: Point) -> float:
            return min([frame.pixels(p, c) - size / 2 - _NODE_GAP for c, size in nodes]
                       + [frame.pixels(p, q) - _MARKER_GAP for q in placed] + [math.inf])

        spots = [_point(a, b, bend, t) for t in _SPOTS]
        placed.append(next((p for p in spots if room(p) >= 0), max(spots, key=room)))
    return placed


def layer_axis(pos: dict[str, Point], frame: Frame, title: str) -> dict[str, object]:
    """A plotly x axis ticked at every layer between the outermost nodes (``embed`` and ``logits`` where they
    stand), not between them."""
    names = {round(x): n for n, (x, _) in pos.items() if n in ("embed", "logits")}
    ticks = list(range(math.ceil(frame.x[0]), math.floor(frame.x[1]) + 1))
    return {"title": title, "tickvals": ticks, "ticktext": [names.get(t, str(t)) for t in ticks],
            "range": list(frame.x), "zeroline": False}
