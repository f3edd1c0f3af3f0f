"""`auto`: attribution for every head, then exact runs until the leading heads are settled -- the head scan's
``auto`` strategy."""

from __future__ import annotations

from typing import Any, Sequence

from gna_interp.circuits.algorithms.registry import algorithm
from gna_interp.circuits.algorithms.scores import GraphScores
from gna_interp.circuits.scan import scan_heads
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task


@algorithm("auto")
def auto(model: Model, task: Task, *, heads: Sequence[HeadRef | str] | None = None, **options: Any) -> GraphScores:
    """``scan_heads(model, task, heads, strategy="auto", **options)``'s drops: exact for the heads it ran
    (:attr:`GraphScores.exact`), the attribution estimate for the others (``certify``, ``verify``, ... as
    :class:`~gna_interp.circuits.scan.ScanConfig` takes them)."""
    return GraphScores.of_scan(scan_heads(model, task, heads, strategy="auto", **options))
