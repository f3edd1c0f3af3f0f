"""The circuit's edge table and the roles its heads play *by cause* (measured paths), beside the pattern roles.

:func:`circuit_edges` lists what :func:`~gna_interp.circuits.search.discovery.discover` measures among the circuit's
top heads with :mod:`gna_interp.circuits.edges.paths`: every earlier-layer head as sender into every later-layer head as
receiver, along three inputs --

- ``k@items`` and ``v@items``: the sender's write at the lines' (or options') tokens into the receiver's keys /
  values -- the gather -> aggregate edge of Bick, Xing & Gu. The paper places it at each line's summary (last)
  token; the edge is measured at every token of the lines, the summary token included, because a receiver may read
  a line at another of its tokens: on SmolLM2, L16H0 -> L18H6 along the keys costs +1.00 at the lines' tokens and
  nothing measurable at the newlines alone (docs/discovery.md §10). ``Edge(..., "k", "summary")`` measures the
  summary tokens alone;
- ``q@decision``: its write at the decision position into the receiver's query (what the receiver looks for);

-- and each head's direct path to the answer logits (``-> logits``). :func:`causal_roles` reads roles off the
table; an edge *holds* when its paired bootstrap interval lies above 0 and its effect is at least
:data:`MATERIAL` of the sender's own drop:

==============  ===================================================================================================
causal role     measured
==============  ===================================================================================================
``aggregate``   its direct path to the logits holds (at least :data:`MATERIAL` of its own drop) *and* a key/value
                edge into it at the lines' tokens holds
``gather``      a key/value edge from it into a later head at the lines' tokens holds
``output``      its direct path holds, but no key/value edge into it (it writes the answer from what it reads
                elsewhere)
``query``       only an edge into what a later head reads at the decision holds (its query, or its keys /
                values at the decision position): it shapes what that head looks for or reads there
``relay``       only an edge into what it reads at the decision holds (it reads what an earlier head wrote at the
                decision position), and its own effect runs on outside the edge table
``none``        no measured path holds: its effect runs through heads or MLPs outside the edge table
==============  ===================================================================================================

A head that is both gather and aggregate is named by the larger of the two effects, and the reason says both.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import pandas as pd

from gna_interp.bootstrap import far_outside
from gna_interp.errors import HeadError, InputError
from gna_interp.circuits.edges.paths import PathEffects, PathOptions, PathPatcher, path_effects
from gna_interp.models.graph import LOGITS, Edge
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task

MATERIAL = 0.1
EDGE_COLUMNS = ["edge", "sender", "receiver", "input", "positions", "effect", "low", "high"]
ROLE_COLUMNS = ["name", "causal_role", "causal_reason", "direct_effect", "direct_low", "direct_high"]
KV = ("k", "v")
KV_AT = "items"  # where the key/value edges are measured: every token of the lines, the summary token included

__all__ = ["EDGE_COLUMNS", "MATERIAL", "ROLE_COLUMNS", "causal_roles", "check_edge_table", "circuit_edges", "measure_edges",
           "strongest_path"]


def circuit_edges(heads: Sequence[HeadRef], decision_kv: bool = False) -> list[Edge]:
    """The edges measured among ``heads``: for each earlier -> later pair ``k@items``, ``v@items`` and
    ``q@decision`` (with ``decision_kv``, also ``k@decision`` and ``v@decision``: what a later head reads at the
    decision position itself), and each head's direct path to the logits."""
    out = []
    for s in heads:
        for r in heads:
            if r.layer > s.layer:
                out += [Edge(s, r, "k", KV_AT), Edge(s, r, "v", KV_AT), Edge(s, r, "q", "decision")]
                out += [Edge(s, r, "k", "decision"), Edge(s, r, "v", "decision")] if decision_kv else []
        out.append(Edge(s, None, LOGITS, "all"))
    return out


def measure_edges(model: Model, task: Task, heads: Sequence[HeadRef], config: PathOptions | None = None,
                  decision_kv: bool = False, known: pd.DataFrame | None = None, **overrides: Any) -> pd.DataFrame:
    """The edge table of ``heads`` on ``task`` (columns :data:`EDGE_COLUMNS`; effect = drop of the metric when
    the edge alone is removed, with a 95 % paired bootstrap interval); ``config``: a :class:`PathOptions` (or keyword
    overrides of its fields: ``metric``, ``method``, ``reference``, ``batch_size``); ``decision_kv``: see
    :func:`circuit_edges`. ``known``: an edge table measured on the same task with the same metric and ablation (a
    scan's own); its rows among these edges are taken as they are (each edge's interval is its own bootstrap) and only
    the others are measured."""
    cfg = PathOptions.build(config, **overrides)
    edges = circuit_edges(list(heads), decision_kv)
    have = {} if known is None else {Edge.from_dict(r).name: r for r in known[EDGE_COLUMNS].to_dict("records")}
    todo = [e for e in edges if e.name not in have]
    if todo:
        pp = PathPatcher(model, task, cfg.method, cfg.reference, cfg.batch_size)
        effects: PathEffects = path_effects(model, task, todo, cfg, patcher=pp)
        have.update({Edge.from_dict(r).name: r for r in effects.to_frame()[EDGE_COLUMNS].to_dict("records")})
    return pd.DataFrame([have[e.name] for e in edges], columns=EDGE_COLUMNS)


def check_edge_table(rows: Any, heads: Iterable[HeadRef], where: str = "the edge table") -> pd.DataFrame:
    """An edge table (a DataFrame or its records, columns :data:`EDGE_COLUMNS`) checked for meaning, as
    :class:`InputError` naming ``where`` and the row: each row an :class:`~gna_interp.models.graph.Edge` (sender
    before receiver, an input the receiver reads, ``logits`` only for the direct path, known positions) between
    ``heads`` (the scanned heads of the model), no edge twice, ``effect`` / ``low`` / ``high`` numbers (missing:
    not measured) with ``low <= high``. The ``edge`` label is derived from the row, never read back."""
    records = rows.to_dict("records") if isinstance(rows, pd.DataFrame) else list(rows)
    known = {h.name for h in heads}
    seen: dict[str, int] = {}
    out = []
    for i, row in enumerate(records):
        try:
            if not isinstance(row, dict):
                raise InputError(f"a row must be a mapping with the columns {EDGE_COLUMNS}, got {type(row).__name__}")
            edge = Edge.from_dict(row)
            for name in (edge.sender, None if edge.direct else edge.receiver):
                if name is not None and name not in known:
                    raise InputError(f"names the head {name}, which is not among the {len(known)} scanned heads")
            if edge.name in seen:
                raise InputError(f"measures {edge.name} again (row {seen[edge.name]} measured it)")
            seen[edge.name] = i
            numbers = {k: _number(row.get(k), k) for k in ("effect", "low", "high")}
            if numbers["low"] > numbers["high"]:  # (a missing bound compares False)
                raise InputError(f"its interval is reversed: low {numbers['low']} > high {numbers['high']}")
            if far_outside(numbers["effect"], numbers["low"], numbers["high"]):
                raise InputError(f"its effect {numbers['effect']} lies far outside its own interval "
                                 f"[{numbers['low']}, {numbers['high']}]")
        except (InputError, HeadError) as e:
            raise InputError(f"{where}: row {i}: {e}; the file was edited: rerun `gna scan`") from None
        out.append({"edge": edge.name, "sender": edge.sender, "receiver": edge.receiver, "input": edge.input,
                    "positions": edge.positions, **numbers})
    return pd.DataFrame(out, columns=EDGE_COLUMNS)


def _number(value: Any, name: str) -> float:
    """An edge table's ``name`` value as a float: a finite number, or NaN for a missing one (not measured)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise InputError(f"{name} is {value}, not a finite number")
    return float(value)


def _holds(row: Any, drop: float) -> bool:
    if not math.isfinite(drop):
        raise InputError(f"the drop {drop} compared with the edge {row['edge']} is not a number: causal roles need each "
                         f"head's drop in the edges' metric (Circuit.edge_drops)")
    return bool(row["low"] > 0 and row["effect"] >= MATERIAL * max(drop, 0.0))


def _holding(rows: pd.DataFrame, drop_of: Any) -> pd.DataFrame:
    """The rows of ``rows`` that hold (``drop_of(row)``: the drop the effect is compared with), largest first."""
    mask = pd.Series([_holds(r, drop_of(r)) for _, r in rows.iterrows()], index=rows.index, dtype=bool)
    return rows[mask].sort_values("effect", ascending=False)


def _fmt(row: Any) -> str:
    return f"{row['edge']} {row['effect']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}]"


def _at_lines(edges: pd.DataFrame) -> pd.Series:
    """Key/value edges at the lines' (or options') tokens: the gather -> aggregate reads."""
    return edges["input"].isin(KV) & (edges["positions"] != "decision")


def _at_decision(edges: pd.DataFrame) -> pd.Series:
    """Edges into what a later head reads at the decision position: its query, or its keys / values there."""
    return (edges["input"] == "q") | (edges["input"].isin(KV) & (edges["positions"] == "decision"))


def causal_roles(edges: pd.DataFrame, drops: dict[str, float]) -> pd.DataFrame:
    """Each head of the edge table with its causal role and the measurement behind it (columns
    :data:`ROLE_COLUMNS`); ``drops`` are the heads' own drops (``{name: drop}``)."""
    rows = []
    names = list(dict.fromkeys(list(edges["sender"]) + [r for r in edges["receiver"] if r != LOGITS]))
    for name in names:
        drop = float(drops.get(name, 0.0))
        direct = edges[(edges["sender"] == name) & (edges["receiver"] == LOGITS)]
        d = direct.iloc[0] if len(direct) else None
        lines, at_decision = _at_lines(edges), _at_decision(edges)
        kv_out = _holding(edges[(edges["sender"] == name) & lines], lambda r: drop)
        kv_in = _holding(edges[(edges["receiver"] == name) & lines], lambda r: float(drops.get(r["sender"], 0.0)))
        q_out = _holding(edges[(edges["sender"] == name) & at_decision], lambda r: drop)
        dec_in = _holding(edges[(edges["receiver"] == name) & at_decision],
                          lambda r: float(drops.get(r["sender"], 0.0)))
        direct_holds = d is not None and _holds(d, drop)
        aggregate = direct_holds and len(kv_in) > 0
        gather = len(kv_out) > 0
        parts = []
        if d is not None:
            parts.append(f"direct path {_fmt(d)}")
        if len(kv_in):
            parts.append(f"reads {_fmt(kv_in.iloc[0])}")
        if gather:
            parts.append(f"feeds {_fmt(kv_out.iloc[0])}")
        if aggregate and gather:
            role = "aggregate" if float(d["effect"]) >= float(kv_out.iloc[0]["effect"]) else "gather"
        elif aggregate:
            role = "aggregate"
        elif gather:
            role = "gather"
        elif direct_holds:
            role = "output"
            parts.append("no key/value edge from the measured heads into it holds")
        elif len(q_out):
            role = "query"
            parts.append(f"feeds what a later head reads at the decision: {_fmt(q_out.iloc[0])}")
        elif len(dec_in):
            role = "relay"
            parts.append(f"reads what an earlier head wrote at the decision: {_fmt(dec_in.iloc[0])}; its own effect "
                         f"runs on through heads or MLPs outside the edge table")
        else:
            role = "none"
            best = edges[edges["sender"] == name].sort_values("effect", ascending=False)
            parts.append("no measured path holds (interval above 0 and at least "
                         f"{MATERIAL:.0%} of its drop {drop:.3f})" +
                         (f"; its largest: {_fmt(best.iloc[0])}" if len(best) else "") +
                         ": its effect runs through heads or MLPs outside the edge table")
        rows.append({"name": name, "causal_role": role, "causal_reason": "; ".join(parts),
                     "direct_effect": float(d["effect"]) if d is not None else math.nan,
                     "direct_low": float(d["low"]) if d is not None else math.nan,
                     "direct_high": float(d["high"]) if d is not None else math.nan})
    return pd.DataFrame(rows, columns=ROLE_COLUMNS)


def strongest_path(edges: pd.DataFrame, roles: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """The strongest gather -> aggregate path: the key/value edge (at the lines' tokens) with the largest effect
    whose interval lies above 0, preferring one into a head whose causal role is ``aggregate``; None when no such
    edge holds."""
    kv = edges[_at_lines(edges) & (edges["low"] > 0)]
    if kv.empty:
        return None
    if roles is not None and len(roles):
        agg = set(roles.loc[roles["causal_role"] == "aggregate", "name"])
        into = kv[kv["receiver"].isin(agg)]
        kv = into if len(into) else kv
    row = kv.sort_values("effect", ascending=False).iloc[0]
    return {k: (float(row[k]) if k in ("effect", "low", "high") else str(row[k])) for k in EDGE_COLUMNS}
