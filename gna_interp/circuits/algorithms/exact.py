"""`exact`: each head's ablation drop, measured -- the head scan's ``exact`` strategy."""

from __future__ import annotations

from typing import Any, Sequence

from gna_interp.circuits.algorithms.registry import algorithm
from gna_interp.circuits.algorithms.scores import GraphScores
from gna_interp.circuits.scan import scan_heads
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task


@algorithm("exact")
def exact(model: Model, task: Task, *, heads: Sequence[HeadRef | str] | None = None, **options: Any) -> GraphScores:
    """``scan_heads(model, task, heads, strategy="exact", **options)``'s drops (``options``: the other
    :class:`~gna_interp.circuits.scan.ScanConfig` fields)."""
    return GraphScores.of_scan(scan_heads(model, task, heads, strategy="exact", **options))
