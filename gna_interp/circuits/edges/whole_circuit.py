"""`WholeCircuit`: the smallest edge set of the whole graph that keeps a share of the task, as circuit.json's ``whole``.

The whole graph has four kinds of node -- the embeddings (``embed``), every head (``L16H0``), every MLP
(``MLP3``) and the answer logits (``logits``) -- and an edge runs from an earlier node into one input of a later
one: a head's query, key or value (``q`` / ``k`` / ``v``; ``other`` for the inputs of other head kinds), an MLP's
input (``mlp``) or the logits (``logits``), at a position class (``items``: the lines' tokens; ``decision``: the
decision position; ``other``: every other token; ``all``). A whole circuit is such an edge set with the fraction of the intact metric it keeps
when everything outside it is ablated (``kept``, with its interval ``low`` .. ``high``), and each edge's screen
``score`` and, where it was measured exactly by path patching, its ``effect`` with a 95 % interval.

The document (circuit.json's ``whole``; :meth:`WholeCircuit.to_dict` / :meth:`WholeCircuit.from_dict`)::

    {"metric": "logit_diff", "method": "mean", "threshold": 0.8, "kept": 0.85, "low": 0.76, "high": 0.97,
     "nodes": [{"name": "L16H0", "kind": "head", "layer": 16, "role": "gather"}, ...],
     "edges": [{"sender": "L16H0", "receiver": "L18H6", "input": "k", "positions": "items",
                "score": 0.71, "effect": 0.99, "low": 0.70, "high": 1.29}, ...]}

Its types and ranges are checked by circuit.json's schema (:mod:`gna_interp.schemas`); what a schema cannot say
(an edge between known nodes, sender before receiver, an input its receiver reads, a head of the scan, a name
that agrees with its layer) by :meth:`WholeCircuit.from_dict`, as :class:`~gna_interp.errors.InputError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import pandas as pd

from gna_interp.bootstrap import far_outside
from gna_interp.errors import HeadError, InputError
from gna_interp.html_repr import counted
from gna_interp.models.graph import EMBED, LOGITS, NODE_KINDS, POSITIONS, RECEIVES, Edge
from gna_interp.models.heads import HeadRef

__all__ = ["EMBED", "LOGITS", "NODE_KINDS", "WholeCircuit", "WholeEdge", "WholeNode"]


@dataclass(frozen=True)
class WholeNode:
    """One node of the whole graph: ``name`` (``L16H0``, ``MLP3``, ``embed``, ``logits``), ``kind`` (one of
    :data:`NODE_KINDS`), ``layer`` (-1 for the embeddings, the number of layers for the logits) and its causal
    ``role`` (``""`` when none)."""

    name: str
    kind: str
    layer: int
    role: str = ""

    @property
    def order(self) -> tuple[float, int]:
        """Where the node sits in the forward pass: by layer, a block's heads before its MLP, the logits last."""
        if self.kind == "logits":
            return (math.inf, 0)
        return (float(self.layer), 1 if self.kind == "mlp" else 0)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "layer": self.layer, "role": self.role}


@dataclass(frozen=True)
class WholeEdge(Edge):
    """One edge of the graph (:class:`~gna_interp.models.graph.Edge`: ``sender`` -> ``receiver``'s ``input`` at
    ``positions``) with what was measured of it: ``score`` its screen score, ``effect`` (``low`` .. ``high``: its 95 %
    interval) the drop of the metric when the edge alone is removed, None where it was screened but not measured
    exactly."""

    score: float | None = None
    effect: float | None = None
    low: float | None = None
    high: float | None = None

    @property
    def measured(self) -> bool:
        """Whether the edge's effect was measured exactly (not only screened)."""
        return self.effect is not None

    @property
    def weight(self) -> float:
        """The edge's strength as drawn: its exact effect, else its screen score (0 when neither is known)."""
        v = self.effect if self.effect is not None else self.score
        return float(v) if v is not None else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"sender": self.sender, "receiver": self.receiver, "input": self.input, "positions": self.positions,
                "score": self.score, "effect": self.effect, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class WholeCircuit:
    """An edge set of the whole graph and the share of the intact ``metric`` it keeps with everything outside it
    ablated (``method``): ``kept`` with its interval ``low`` .. ``high`` (None: not measured); ``threshold`` the
    share the search aimed for; ``n_edges`` the edges of the search's own graph, where an input that several heads
    share (a key/value group) is one edge drawn here into each of its heads (None: as many as :attr:`edges`).
    Fields of the document not named here are not kept."""

    metric: str
    method: str
    nodes: tuple[WholeNode, ...]
    edges: tuple[WholeEdge, ...]
    threshold: float | None = None
    kept: float | None = None
    low: float | None = None
    high: float | None = None
    n_edges: int | None = None

    def node(self, name: str) -> WholeNode:
        """The node called ``name`` (KeyError when there is none)."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def count(self, kind: str) -> int:
        """How many nodes of ``kind`` (one of :data:`NODE_KINDS`) the circuit has."""
        return sum(n.kind == kind for n in self.nodes)

    def sentence(self) -> str:
        """What the circuit keeps and its size, in one sentence."""
        metric = {"logit_diff": "logit difference"}.get(self.metric, self.metric)
        drawn = ("" if self.n_edges in (None, len(self.edges)) else
                 f", from {self.n_edges} edges of the searched graph, a shared key/value input drawn into each head")
        size = (f"{counted(len(self.nodes), 'node')} ({counted(self.count('head'), 'head')}, "
                f"{counted(self.count('mlp'), 'MLP')}) and {counted(len(self.edges), 'edge')} "
                f"({sum(e.measured for e in self.edges)} measured exactly{drawn})")
        if self.kept is None:
            return f"The whole circuit has {size}; the share of the intact {metric} it keeps was not measured."
        interval = (f" (95% interval {self.low:.0%} to {self.high:.0%})" if self.low is not None and self.high is not None
                    else "")
        aim = f", threshold {self.threshold:.0%}" if self.threshold is not None else ""
        return (f"The whole circuit keeps {self.kept:.0%}{interval} of the intact {metric} with everything "
                f"outside it ablated ({self.method} ablation{aim}); it has {size}.")

    def to_frame(self) -> pd.DataFrame:
        """The edges, one row each: ``edge`` (its label), ``sender``, ``receiver``, ``input``, ``positions``,
        ``score``, ``effect``, ``low``, ``high`` (NaN: not measured)."""
        rows = [{"edge": e.name, **{k: (math.nan if v is None else v) for k, v in e.to_dict().items()}}
                for e in self.edges]
        return pd.DataFrame(rows, columns=["edge", "sender", "receiver", "input", "positions", "score", "effect",
                                           "low", "high"])

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (circuit.json's ``whole``)."""
        return {"metric": self.metric, "method": self.method, "threshold": self.threshold, "kept": self.kept,
                "low": self.low, "high": self.high, **({"n_edges": self.n_edges} if self.n_edges is not None else {}),
                "nodes": [n.to_dict() for n in self.nodes], "edges": [e.to_dict() for e in self.edges]}

    @classmethod
    def from_dict(cls, doc: Any, heads: Iterable[HeadRef] | None = None,
                  where: str = "the whole circuit") -> "WholeCircuit":
        """The circuit :meth:`to_dict` described, checked for meaning: every edge between two of its nodes, the
        sender before the receiver, an input the receiver reads, no node or edge twice, head names that agree with
        their layer and (given ``heads``, the scanned heads) are among them, intervals not reversed. Refused as
        :class:`InputError` naming ``where`` and the entry."""
        if not isinstance(doc, dict):
            raise InputError(f"{where} must be a mapping, got {type(doc).__name__}")
        try:
            nodes = tuple(_node(n, i, heads) for i, n in enumerate(_list(doc, "nodes")))
            named = _unique({n.name: n for n in nodes}, [n.name for n in nodes], "node")
            edges = tuple(_edge(e, i, named) for i, e in enumerate(_list(doc, "edges")))
            _unique({e.name: e for e in edges}, [e.name for e in edges], "edge")
            kept = _bounded(doc, ("kept", "low", "high"), "")
            out = cls(metric=_text(doc, "metric"), method=_text(doc, "method"), nodes=nodes, edges=edges,
                      threshold=_number(doc.get("threshold"), "threshold"), n_edges=_count(doc.get("n_edges")),
                      **kept)
        except (InputError, HeadError) as e:
            raise InputError(f"{where}: {e}; the file was edited or comes from elsewhere: rerun `gna circuit`") from None
        return out


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise InputError(f"field {key!r} must be a list, got {type(value).__name__}")
    return value


def _text(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise InputError(f"field {key!r} must be a non-empty string, got {value!r:.80}")
    return value


def _number(value: Any, name: str) -> float | None:
    """A finite number as a float, or None for a missing one."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{name} must be a finite number or null, got {value!r:.80}")
    return float(value)


def _count(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"n_edges must be a count or null, got {value!r:.80}")
    return value


def _bounded(doc: dict[str, Any], keys: tuple[str, str, str], prefix: str) -> dict[str, float | None]:
    """``doc``'s value and interval fields (``keys``: value, low, high) as numbers, the interval not reversed."""
    out = {k: _number(doc.get(k), prefix + k) for k in keys}
    low, high = out[keys[1]], out[keys[2]]
    if low is not None and high is not None and low > high:
        raise InputError(f"{prefix}interval is reversed: {keys[1]} {low} > {keys[2]} {high}")
    if far_outside(out[keys[0]], low, high):
        raise InputError(f"{prefix}{keys[0]} {out[keys[0]]} lies far outside its own interval [{low}, {high}]")
    return out


def _unique(named: dict[str, Any], names: list[str], what: str) -> dict[str, Any]:
    if len(named) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise InputError(f"the {what} {twice!r} is listed twice")
    return named


def _node(row: Any, i: int, heads: Iterable[HeadRef] | None) -> WholeNode:
    if not isinstance(row, dict):
        raise InputError(f"node {i} must be a mapping, got {type(row).__name__}")
    name, kind, layer, role = row.get("name"), row.get("kind"), row.get("layer"), row.get("role") or ""
    if kind not in NODE_KINDS:
        raise InputError(f"node {i} has kind {kind!r:.40}, not one of {list(NODE_KINDS)}")
    if not isinstance(layer, int) or isinstance(layer, bool) or not isinstance(name, str) or not isinstance(role, str):
        raise InputError(f"node {i} needs a string name and role and an integer layer, got {row!r:.120}")
    want = {"embed": EMBED, "logits": LOGITS, "mlp": f"MLP{layer}"}.get(kind)
    if kind == "head":
        head = HeadRef.parse(name)
        if head.layer != layer:
            raise InputError(f"node {i} is {name!r} at layer {layer}, which do not agree")
        known = None if heads is None else {h.name for h in heads}
        if known is not None and name not in known:
            raise InputError(f"node {i} names the head {name!r}, which is not among the {len(known)} scanned heads")
    elif name != want or (kind == "embed" and layer != -1) or (kind == "mlp" and layer < 0):
        raise InputError(f"node {i} is {name!r} of kind {kind} at layer {layer}; a {kind} node is "
                         + ("'embed' at layer -1" if kind == "embed" else "'logits'" if kind == "logits"
                            else "'MLP<layer>' at its layer"))
    return WholeNode(name, kind, layer, role)


def _edge(row: Any, i: int, nodes: dict[str, WholeNode]) -> WholeEdge:
    if not isinstance(row, dict):
        raise InputError(f"edge {i} must be a mapping, got {type(row).__name__}")
    sender, receiver = nodes.get(row.get("sender")), nodes.get(row.get("receiver"))  # type: ignore[arg-type]
    if sender is None or receiver is None:
        missing = row.get("sender") if sender is None else row.get("receiver")
        raise InputError(f"edge {i} names {missing!r:.60}, which is not one of the circuit's nodes")
    inp, positions = row.get("input"), row.get("positions")
    if inp not in RECEIVES[receiver.kind]:
        raise InputError(f"edge {i} ({sender.name} -> {receiver.name}) reaches input {inp!r:.40}, but a "
                         f"{receiver.kind} node reads {list(RECEIVES[receiver.kind]) or 'nothing'}")
    if positions not in POSITIONS:
        raise InputError(f"edge {i} has positions {positions!r:.40}, not one of {list(POSITIONS)}")
    if sender.kind == "logits" or not sender.order < receiver.order:
        raise InputError(f"edge {i} runs from {sender.name} to {receiver.name}, which does not come later")
    return WholeEdge(sender.name, receiver.name, inp, positions, score=_number(row.get("score"), f"edge {i}'s score"),
                     **_bounded(row, ("effect", "low", "high"), f"edge {i}'s "))
