"""`eap`: edge attribution patching over every edge of the graph (Syed, Rager & Conmy 2023)."""

from __future__ import annotations

from typing import Any

from gna_interp.circuits.algorithms.registry import algorithm
from gna_interp.circuits.algorithms.scores import GraphScores
from gna_interp.circuits.edges.edge_screen import screen_edges
from gna_interp.interventions.ablation import AblationMethod
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task


@algorithm("eap")
def eap(model: Model, task: Task, *, method: AblationMethod = "zero", reference: Any = None, batch_size: int = 16,
        verify: int = 0) -> GraphScores:
    """``screen_edges(model, task, method, reference, verify, batch_size)``'s scores: each edge's first-order drop
    from one forward and one backward per batch (``verify`` edges also measured exactly, kept in ``detail``)."""
    return GraphScores.of_screen(screen_edges(model, task, method, reference, verify, batch_size), 1)
