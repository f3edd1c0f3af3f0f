"""`GraphScores`: what every discovery algorithm returns -- one score per node or per edge of the model's graph.

A score is the drop of the task's metric (the intact value minus the value with that node or edge removed), measured
exactly or estimated to first order; names are those of :mod:`gna_interp.models.graph` (nodes: ``L1H0``, ``MLP3``,
``embed``) or of :class:`~gna_interp.models.graph.Edge` (edges: ``L0H3 -> L1H3.k@items``), so the circuit
search (:func:`~gna_interp.circuits.search.sufficiency.faithfulness`,
:func:`~gna_interp.circuits.search.sufficiency.edge_faithfulness`) reads any algorithm's scores the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import pandas as pd

from gna_interp.circuits.edges.edge_screen import EdgeScreen
from gna_interp.circuits.scan.result import HeadScan
from gna_interp.errors import InputError
from gna_interp.models.graph import Edge, Node
from gna_interp.models.heads import HeadRef

__all__ = ["EDGE_COLUMNS", "NODE_COLUMNS", "UNITS", "GraphScores", "Unit"]

Unit = Literal["nodes", "edges"]
UNITS: tuple[str, ...] = ("nodes", "edges")
NODE_COLUMNS = ["name", "kind", "layer", "score", "exact", "abs_rank"]
EDGE_COLUMNS = ["name", "sender", "receiver", "input", "positions", "score", "exact", "abs_rank"]


def _check_names(unit: str, names: list[str]) -> None:
    """Refuse a name that is not a node (``nodes``) or an edge between nodes (``edges``) of the graph, or that does
    not print back as itself."""
    seen: set[str] = set()
    for name in names:
        if unit == "nodes":
            if name not in seen:
                Node.parse(name)
                seen.add(name)
            continue
        edge = Edge.parse(name)
        if edge.name != name:
            raise InputError(f"edge name {name[:80]!r} does not print back as itself ({edge.name[:80]!r})")


def _order_key(score: float) -> float:
    """Sort key of a score: largest ``|score|`` first, NaN last."""
    return math.inf if math.isnan(score) else -abs(score)


@dataclass(frozen=True)
class GraphScores:
    """One score per node or edge of a model's graph, from one discovery algorithm.

    Attributes:
        unit: ``nodes`` or ``edges``.
        scores: ``{name: score}`` in the algorithm's order; a score is the metric's drop when that node or edge alone
            is removed (positive: the task needs it).
        metric: what a score is a drop of (``logit_diff``: the mean logit difference).
        exact: the names whose score was measured exactly (the others are first-order estimates).
        algorithm: the registered name that made them (:func:`~gna_interp.circuits.algorithms.algorithm` sets it).
        seconds: wall time; exact_runs: runs of the task with one node or edge removed; gradient_passes:
            forward-and-backward passes over the task.
        detail: the result the algorithm wraps (a :class:`~gna_interp.circuits.scan.result.HeadScan`, an
            :class:`~gna_interp.circuits.edges.edge_screen.EdgeScreen`), or None; not compared.
    """

    unit: Unit
    scores: Mapping[str, float] = field(repr=False)
    metric: str = "logit_diff"
    exact: frozenset[str] = field(default=frozenset(), repr=False)
    algorithm: str = ""
    seconds: float = 0.0
    exact_runs: int = 0
    gradient_passes: int = 0
    detail: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise InputError(f"unit must be one of {UNITS}, got {self.unit!r}")
        if not isinstance(self.scores, Mapping):
            raise InputError(f"scores must be a mapping {{name: score}}, got {type(self.scores).__name__}")
        bad = [n for n in self.scores if not isinstance(n, str)]
        if bad:
            raise InputError(f"score names are strings (as printed by the graph), got {bad[0]!r:.60}")
        scores = {name: float(value) for name, value in self.scores.items()}
        _check_names(self.unit, list(scores))
        exact = frozenset(self.exact)
        if not exact <= scores.keys():
            raise InputError(f"exact names {sorted(exact - scores.keys())[:3]} have no score")
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "exact", exact)

    @classmethod
    def of_scan(cls, scan: HeadScan) -> "GraphScores":
        """A head scan's drops (:meth:`~gna_interp.circuits.scan.result.HeadScan.drops`: exact where the head was
        run, else its attribution estimate) as node scores."""
        return cls("nodes", {h.name: d for h, d in scan.drops().items()}, scan.metric,
                   frozenset(h.name for h in scan.exact), exact_runs=len(scan.exact),
                   gradient_passes=1 if scan.estimates else 0, detail=scan)

    @classmethod
    def of_screen(cls, screen: EdgeScreen, gradient_passes: int) -> "GraphScores":
        """An edge screen's EAP scores as edge scores, one per row (a head's input once per head, even where heads
        share it), in the screen's order."""
        t = screen.table
        names = [Edge(*row).name for row in zip(t["sender"], t["receiver"], t["input"], t["positions"])]
        return cls("edges", dict(zip(names, t["score"].tolist())), exact_runs=int(t["effect"].notna().sum()),
                   gradient_passes=gradient_passes, detail=screen)

    def __len__(self) -> int:
        return len(self.scores)

    def ranked(self, k: int | None = None) -> list[str]:
        """The names by ``|score|``, largest first (ties in the algorithm's order, NaN last); the first ``k``."""
        return sorted(self.scores, key=lambda n: _order_key(self.scores[n]))[:k]

    def heads(self) -> list[HeadRef]:
        """The scored heads, ranked (:meth:`ranked`; other nodes left out): the order
        :func:`~gna_interp.circuits.search.sufficiency.faithfulness` grows a circuit in."""
        if self.unit != "nodes":
            raise InputError(f"these are edge scores ({self.algorithm or 'unnamed'}): a head ranking needs node scores"
                             f" (e.g. 'exact', 'attribution', 'auto'); edge_faithfulness reads edge scores")
        nodes = (Node.parse(n) for n in self.ranked())
        return [x.head for x in nodes if x.head is not None]

    def wires(self) -> list[Edge]:
        """The scored edges, ranked (:meth:`ranked`)."""
        self._need_edges()
        return [Edge.parse(n) for n in self.ranked()]

    def edge_rows(self) -> pd.DataFrame:
        """The edges as an edge screen names its rows (``sender``, ``receiver`` a node, ``input``, ``positions``,
        ``score``), in the algorithm's order: what
        :meth:`~gna_interp.circuits.edges.edge_circuit.EdgeCircuit.from_screen` reads (an input several heads share is
        named by its first head)."""
        self._need_edges()
        rows = []
        for name, score in self.scores.items():
            edge = Edge.parse(name)
            rows.append((edge.sender, edge.receiver.split("+")[0], edge.input, edge.positions, score))
        return pd.DataFrame(rows, columns=["sender", "receiver", "input", "positions", "score"])

    def _need_edges(self) -> None:
        if self.unit != "edges":
            raise InputError(f"these are node scores ({self.algorithm or 'unnamed'}): an edge ranking needs edge scores"
                             f" (e.g. 'eap', 'eap_ig', 'edge_exact'); faithfulness reads node scores")

    def to_frame(self) -> pd.DataFrame:
        """One row per name, ranked: columns :data:`NODE_COLUMNS` (``kind``, ``layer`` of the node; the logits'
        layer None) or :data:`EDGE_COLUMNS` (the edge's ``sender``, ``receiver``, ``input`` and ``positions``);
        ``exact`` whether the score was measured, ``abs_rank`` its rank by ``|score|``."""
        rows = []
        for rank, name in enumerate(self.ranked(), start=1):
            if self.unit == "nodes":
                node = Node.parse(name)
                where = {"kind": node.kind, "layer": node.layer}
            else:
                where = Edge.parse(name).to_dict()
            rows.append({"name": name, **where, "score": self.scores[name], "exact": name in self.exact,
                         "abs_rank": rank})
        return pd.DataFrame(rows, columns=NODE_COLUMNS if self.unit == "nodes" else EDGE_COLUMNS)

    def __repr__(self) -> str:
        top = ", ".join(f"{n} {self.scores[n]:+.3g}" for n in self.ranked(3))
        return (f"GraphScores({self.algorithm or 'unnamed'}: {len(self)} {self.unit}, {len(self.exact)} exact, "
                f"{self.seconds:.1f} s; top {top})")
