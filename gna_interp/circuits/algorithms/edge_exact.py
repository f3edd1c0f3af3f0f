"""`edge_exact`: each edge's drop, measured -- the model with every edge kept but that one, whatever its sender
(a head, an MLP, the embeddings) and receiver."""

from __future__ import annotations

from typing import Any, Sequence

from gna_interp.circuits.algorithms.registry import algorithm
from gna_interp.circuits.algorithms.scores import GraphScores
from gna_interp.circuits.edges.edge_circuit import EdgeCircuit
from gna_interp.engine.metrics import LOGIT_DIFF, results
from gna_interp.interventions.ablation import AblationMethod
from gna_interp.models.graph import Edge
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task


@algorithm("edge_exact")
def edge_exact(model: Model, task: Task, *, method: AblationMethod = "zero", reference: Any = None,
               batch_size: int = 8, wires: Sequence[Edge | str] | None = None) -> GraphScores:
    """``m(M) - m(M without e)`` on the mean logit difference for each edge ``e`` of ``wires`` (default: every edge
    of the graph), one :meth:`~gna_interp.circuits.edges.edge_circuit.EdgeCircuit.run_without` run each, the edge's sender
    replaced by its ``method`` ablation (``zero`` as the head scan and the edge screen do, or ``mean``)."""
    ec = EdgeCircuit(model, task, method, reference, batch_size, senders="all")
    todo = ec.wires() if wires is None else [ec.check(Edge.parse(w) if isinstance(w, str) else w) for w in wires]
    intact = LOGIT_DIFF.value(results(ec.clean()))
    without = ec.run_without([[w] for w in todo])
    scores = {w.name: intact - LOGIT_DIFF.value(results(s)) for w, s in zip(todo, without)}
    return GraphScores("edges", scores, exact=frozenset(scores), exact_runs=len(todo))
